"""Records the scheduler core and its store exchange (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra import types as t


@dataclass(frozen=True)
class LeaseSnapshot:
    """Live leases as of one read: placement targets and every worker's epoch."""

    instances: list[t.InstanceLoad]  # rollout-role instances, with the job's load
    epochs: dict[str, int]  # every live lease, any role: worker id -> epoch


@dataclass(frozen=True)
class FinishRecord:
    """One finished trajectory read from the job's trajectory stream."""

    entry_id: str
    trajectory_id: str
    total_tokens: int
    status: t.TrajectoryStatus


@dataclass(frozen=True)
class TickState:
    """What one tick reads in one round trip."""

    state: str | None
    step: int
    published: bool
    counters: dict[str, int] = field(default_factory=dict)
    finishes: list[FinishRecord] = field(default_factory=list)
