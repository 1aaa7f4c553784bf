"""What the scheduler core needs of its store (``SchedulerStore``) and of the policy's
state store (``FlushablePolicyStore``); implemented over Redis (``store.py``) and in
memory (``memory_store.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from libra import types as t
from scheduling.policy.store import PolicyStore
from services.scheduler.state import LeaseSnapshot, TickState, TickWrites


class FlushablePolicyStore(PolicyStore, Protocol):
    """A ``PolicyStore`` whose writes reach durable storage only on ``flush``."""

    async def flush(self, also: Callable[[Any], None] | None = None) -> None:
        """Write every change made since the last flush; ``also`` adds more commands
        to the same atomic write (a tick's writes)."""
        ...


class SchedulerStore(Protocol):
    """Jobs, leases, loads, assignments and queues as the scheduler core sees them."""

    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def job_state(self, job_id: str) -> str | None: ...

    async def lease_snapshot(self, job_id: str) -> LeaseSnapshot: ...

    async def lease_epoch(self, worker_id: str) -> int | None:
        """The epoch of one worker's live lease (None: no live lease); one read."""
        ...

    async def counters(self, job_id: str) -> dict[str, int]: ...

    async def incr_counters(self, job_id: str, **deltas: int) -> None: ...

    async def running_jobs(self) -> list[str]: ...

    async def commit_tick(self, job_id: str, writes: TickWrites,
                          policy_store: FlushablePolicyStore) -> None: ...

    async def pending(self, job_id: str) -> list[t.Trajectory]: ...

    async def requeue(self, job_id: str, traj: t.Trajectory) -> bool:
        """``requeue_many`` of one; whether it was re-queued."""
        ...

    async def requeue_many(self, job_id: str, trajs: list[t.Trajectory]) -> list[str]:
        """Put the trajectories still assigned back in the queue, atomically: each one's
        assignment and task are forgotten and its instance's load goes down by one (as a
        release does: the load always counts the instance's assignments). One no longer
        assigned (finished meanwhile) is skipped. Returns the ids re-queued."""
        ...

    async def tasks_of(self, job_id: str,
                       trajectory_ids: list[str]) -> list[t.Trajectory | None]:
        """``task`` for many, in one read (None where the task is gone)."""
        ...

    async def finish(self, job_id: str, trajectory_id: str) -> str | None: ...

    async def release(self, job_id: str, trajectory_id: str) -> str | None: ...

    async def ensure_finish_group(self, job_id: str) -> None: ...

    async def tick_state(self, job_id: str, finish_cursor: str, max_finishes: int,
                         with_leases: bool = False,
                         orphan_page: tuple[int, int] | None = None) -> TickState:
        """``orphan_page`` (cursor, count): also read that page of the assignments, as
        ``assignments_page`` would, into ``TickState.orphan_page``."""
        ...

    async def assignments(self, job_id: str) -> dict[str, str]: ...

    async def assignments_page(self, job_id: str, cursor: int,
                               count: int) -> tuple[int, dict[str, str]]:
        """About ``count`` assignments from ``cursor`` (0: the start) and the cursor of
        the next page (0: the sweep is done), as HSCAN pages a hash."""
        ...

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None: ...

    async def forget_instances(self, job_id: str, instance_ids: list[str]) -> None:
        """Drop gone instances' inboxes, in one round trip (what they held is re-queued
        from the tasks; their load follows the re-queues, which may come a page at a
        time)."""
        ...

    async def placement_epochs(self, job_id: str) -> dict[str, int]:
        """Instance -> the lease epoch the job's work on it was placed under, as last
        saved (``update_placement_epochs``); read by a starting scheduler."""
        ...

    async def update_placement_epochs(self, job_id: str, epochs: dict[str, int],
                                      gone: list[str]) -> None:
        """Set ``epochs`` and forget ``gone`` in the job's placement epochs, atomically."""
        ...

    async def clear_load(self, job_id: str) -> None:
        """Forget the job's per-instance loads (nothing of it is assigned any more)."""
        ...

    async def job_step(self, job_id: str) -> int: ...

    async def open_policy_store(self, job_id: str) -> FlushablePolicyStore: ...
