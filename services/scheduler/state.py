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
    # The instance whose slot the read gave back; None when the trajectory was no longer
    # assigned (re-queued meanwhile, or read twice).
    released_from: str | None = None


@dataclass(frozen=True)
class TickState:
    """What one tick reads in one round trip."""

    state: str | None
    step: int
    published: bool
    counters: dict[str, int] = field(default_factory=dict)
    finishes: list[FinishRecord] = field(default_factory=list)
    leases: LeaseSnapshot | None = None  # only when the tick asked for it
    # A page of the orphan sweep (next cursor, assignments), only when the tick asked:
    # read in the same round trip, not one more per tick while a sweep is under way.
    orphan_page: tuple[int, dict[str, str]] | None = None


@dataclass
class TickWrites:
    """What one tick decided, written in one transaction at its end."""

    placed_from_pending: list[t.Trajectory] = field(default_factory=list)
    queued: list[t.Trajectory] = field(default_factory=list)  # admitted, no place yet
    placed: list[t.Trajectory] = field(default_factory=list)  # admitted and placed
    num_groups: int = 0  # admitted groups
    eval_round: int = 0  # an eval round admitted (libra/evaluation.py), 0: none
    eval_size: int = 0  # its trajectories
    # Stopped at the per-tick bound with more that would fit: the next tick should not
    # wait a period (SchedulerCore.run).
    is_capped: bool = False

    @property
    def is_empty(self) -> bool:
        return not (self.placed_from_pending or self.queued or self.placed or self.num_groups
                    or self.eval_round)


# Lease roles whose instances receive placements; an instance lent to training
# (hybrid-joining / hybrid-training) keeps its lease but gets nothing new.
ROLLOUT_ROLES = frozenset({t.WorkerRole.CORE_ROLLOUT.value, t.WorkerRole.HYBRID_ROLLOUT.value})


def lease_snapshot(leases: list[t.LeaseSummary | None],
                   active: dict[str, int]) -> LeaseSnapshot:
    """A snapshot from the live leases (``None``: expired, skipped) and the job's load
    per instance."""
    instances, epochs = [], {}
    for lease in sorted((x for x in leases if x is not None), key=lambda x: x.worker_id):
        epochs[lease.worker_id] = lease.epoch
        if lease.role in ROLLOUT_ROLES:
            instances.append(t.InstanceLoad(t.InstanceId(lease.worker_id), lease.bucket,
                                            active.get(lease.worker_id, 0)))
    return LeaseSnapshot(instances, epochs)
