"""What the rollout core needs of its store (``RolloutStore``) and the inbox entries it
reads; implemented over Redis (``store.py``) and in memory (``memory_store.py``).

Apart from ``store.py`` so the core and its parts type their store without importing the
Redis adapter and the protobuf codecs it uses (the purity contract in pyproject.toml)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from libra import types as t
from libra.evaluation import EVAL_FAILED, EVAL_PRODUCED


@dataclass(frozen=True)
class InboxEntry:
    entry_id: str
    job_id: str
    trajectory: t.Trajectory


class RolloutStore(Protocol):
    async def ensure_inbox(self, instance_id: str) -> None: ...

    async def read_inbox(self, instance_id: str, count: int,
                         block_ms: int) -> list[InboxEntry]: ...

    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def job_state(self, job_id: str) -> str | None: ...

    async def policy(self, job_id: str) -> t.PolicyInfo | None: ...

    async def publish(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      lease_epoch: int) -> bool: ...

    async def handoff(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      target_instance: str, target_bucket: str, lease_epoch: int) -> bool: ...

    async def ack(self, instance_id: str, entry_id: str) -> None: ...

    async def hand_back(self, traj: t.Trajectory, instance_id: str, entry_id: str) -> None: ...

    async def clear_inbox(self, instance_id: str) -> None: ...

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None: ...

    async def count(self, job_id: str, name: str) -> None:
        """Bump the job's counter ``name`` by one."""
        ...

    async def report_weights(self, job_id: str, instance_id: str, loaded: int,
                             loading: int) -> None: ...

    async def leave_weights(self, job_id: str, instance_id: str) -> None: ...


# Both stores bump the same counters: the one rule lives beside their shared contract.
def produced_counter(traj: t.Trajectory) -> str:
    """The counter a published trajectory bumps: eval trajectories have their own, so
    the training accounting identity (libra_cli/report.py) never sees them."""
    failed = traj.status is t.TrajectoryStatus.FAILED
    if traj.is_eval:
        return EVAL_FAILED if failed else EVAL_PRODUCED
    return "failed" if failed else "produced"
