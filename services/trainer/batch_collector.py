"""A step's training data: complete, fresh groups read from the trajectory stream (pure).

Duplicates, stale and failed trajectories are acked and counted, never trained on (a
dropped member breaks its whole group); eval trajectories go to their rounds instead.
The collector gets its narrow state through the constructor - the store, the job, the
failure budget, the eval router and a reader of the trainer's current policy version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from libra import metrics
from libra import types as t
from libra.cancellation import raise_if_cancelled
from libra.clock import Clock
from libra.jobspec import JobSpec
from services.trainer import trace_spans
from services.trainer.evaluation import EvalRouter
from services.trainer.failures import RewardFailureBudget
from services.trainer.grpo import GroupBuffer, staleness

if TYPE_CHECKING:  # the store's type only: no redis at run time
    from services.trainer.store_protocol import TrainerStore

logger = logging.getLogger(__name__)


@dataclass
class Batch:
    """One step's entries (stream entry id, trajectory) and what was dropped meanwhile."""

    entries: list[tuple[str, t.Trajectory]]
    dropped_stale: int
    dropped_failed: int
    dropped_groups: int
    wait_s: float


class BatchCollector:
    """Collects one job's batches (one per step) into a :class:`GroupBuffer`."""

    def __init__(self, store: TrainerStore, job_id: str, spec: JobSpec, consumer: str,
                 block_ms: int, failures: RewardFailureBudget, evals: EvalRouter | None,
                 policy_version: Callable[[], int], clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._job_id = job_id
        self._spec = spec
        self._consumer = consumer
        self._block_ms = block_ms
        self._failures = failures
        self._evals = evals
        self._policy_version = policy_version

    async def collect(self, buffer: GroupBuffer, pending: bool) -> Batch:
        """Read the stream until ``prompts_per_step`` complete, fresh groups are in hand."""
        started = time.perf_counter()
        batch = Batch([], 0, 0, 0, 0.0)
        need = self._spec.algorithm.prompts_per_step
        while True:
            while len(buffer.complete()) < need:
                raise_if_cancelled()
                entries = await self._store.read(self._job_id, self._consumer, 64,
                                                 self._block_ms, pending=pending)
                pending = False
                await self._admit(buffer, entries, batch)
            # Members admitted under an older policy may have gone stale while their
            # group filled up: check again right before training.
            version = self._policy_version()
            stale = [g for g in buffer.complete() if any(
                staleness(version, tr) > self._spec.algorithm.max_staleness
                for _, tr in buffer.groups[g])]
            if not stale:
                break
            for group_id in stale:
                await self._drop_group(buffer, group_id, "dropped_stale", batch)
        batch.entries = buffer.take(sorted(buffer.complete())[:need])
        # Counted in process memory only (libra.metrics: prometheus-client, no I/O).
        lag = metrics.histogram("libra_trainer_staleness").labels(self._job_id)
        for _, traj in batch.entries:
            lag.observe(staleness(version, traj))
        batch.wait_s = time.perf_counter() - started
        return batch

    async def _admit(self, buffer: GroupBuffer, entries: list[tuple[str, t.Trajectory]],
                     batch: Batch) -> None:
        """Sort new entries into the buffer; duplicates, stale and failed ones are acked
        and counted (a dropped member breaks its whole group), never trained on. Eval
        trajectories go to their rounds instead (never into a batch)."""
        if self._evals is not None:
            entries = await self._evals.take(entries)
        ids = [tr.trajectory_id for _, tr in entries]
        seen = await self._store.already_consumed(self._job_id, ids)
        # Ids held in the buffer or met earlier in this read are duplicates too: they are
        # not in the consumed set yet, and their second entry must still be acked.
        held = {tr.trajectory_id: e for members in buffer.groups.values() for e, tr in members}
        for (entry_id, traj), is_dup in zip(entries, seen, strict=True):
            if held.get(traj.trajectory_id) == entry_id:
                continue  # the same entry again (a re-read after a lost read): keep it held
            if is_dup or traj.trajectory_id in held:
                # re-delivered after a crash, or a zombie instance's copy
                await self._store.consume(self._job_id, [entry_id], [])
                continue
            held[traj.trajectory_id] = entry_id
            reason = self._drop_reason(traj)
            if reason is None:
                dropped = buffer.add(entry_id, traj)
            else:
                await self._drop_group(buffer, traj.group_id, reason, batch)
                dropped = [(entry_id, traj, reason)]
            await self._drop(dropped, batch)

    async def _drop_group(self, buffer: GroupBuffer, group_id: str, reason: str,
                          batch: Batch) -> None:
        """Break a group (counted once) and drop the members held so far."""
        if group_id not in buffer.broken:
            batch.dropped_groups += 1
            await self._store.consume(self._job_id, [], [], dropped_groups=1)
        await self._drop(buffer.break_group(group_id, reason), batch)

    async def _drop(self, dropped: list[tuple[str, t.Trajectory, str]], batch: Batch) -> None:
        for d_entry, d_traj, d_reason in dropped:
            if d_reason == "dropped_stale":
                batch.dropped_stale += 1
            else:
                batch.dropped_failed += 1
            await self._store.consume(self._job_id, [d_entry], [d_traj.trajectory_id],
                                      **{d_reason: 1})
            trace_spans.dropped(d_traj, d_reason, self._clock.now_ms())

    def _drop_reason(self, traj: t.Trajectory) -> str | None:
        problem = traj.check_aligned()
        if problem is not None:
            logger.warning("[reject] trajectory_id=%s %s", traj.trajectory_id, problem)
            return "dropped_failed"
        if traj.status is not t.TrajectoryStatus.FINISHED:
            self._failures.observe(traj)  # raises when the failure ends the job
            return "dropped_failed"
        if staleness(self._policy_version(), traj) > self._spec.algorithm.max_staleness:
            return "dropped_stale"
        return None
