"""Elastic hybrid pool, coordinator side: turn planner signals into lends and reclaims.

Where it sits: the trainer reports a step -> ``CoordinatorCore.report_step`` -> the
job's ``ElasticLoop.on_step`` feeds the planner (``ElasticPlanner``) and records its
decision, then wakes a background pass of ``ElasticExecutor.reconcile``, so the RPC
never waits for a rollout instance. A pass compares the desired number of hybrid workers
with the live leases and acts:

- join: lend hybrid-rollout instances (``RolloutLending.lend`` with the lease epoch it
  saw and a fresh generation), never leaving fewer than ``reserve_workers`` (and never
  zero) rollout-capable instances (core-rollout + hybrid-rollout);
- release: reclaim joining instances first (cancelling a join is cheap), then active
  ones, each at a fresh generation, so a stale join can never become active;
- a join still hybrid-joining ``join_timeout_s`` after its lend is reclaimed; a lend
  that fails or is not acknowledged within the RPC deadline is rolled back (best effort);
- when the signal's TTL passes (step >= ttl_step) with no fresh signal, everything is
  released (the reference's rule, design section 5.5).

Every action is an event (``ts_ms``, ``kind``, ``step``, ``worker_id``, ``epoch``,
``reason`` and kind-specific keys) written to the job's events stream.
Pure: no grpc/redis imports; rollouts, events and time come in as collaborators.
Files: ``elastic_protocols.py`` (contracts), ``elastic_executor.py`` (the passes), this
module (``ElasticLoop``: one job's planner and executor); ``elastic_jobs.py`` keeps each
job's loop for the core.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from libra import types as t
from libra.clock import Clock
from libra.wire.step_record import step_record_to_dict
from services.coordinator.elastic_executor import (
    DEADLINE_SLACK_S,
    ROLLOUT_CAPABLE,
    ElasticExecutor,
)
from services.coordinator.elastic_protocols import (
    HOLD,
    JOIN,
    RELEASE,
    ElasticPlanner,
    ElasticSignal,
    ElasticWiring,
    EventSink,
    LendReply,
    RolloutLending,
    Signal,
    record_quietly,
)
from services.coordinator.step_metrics import export_plan

# Re-exported: the service and its tests import the elastic names from here.
__all__ = ["DEADLINE_SLACK_S", "HOLD", "JOIN", "RELEASE", "ROLLOUT_CAPABLE", "ElasticExecutor",
           "ElasticLoop", "ElasticPlanner", "ElasticSignal", "ElasticWiring", "EventSink",
           "LendReply", "RolloutLending", "Signal", "pressure_of", "record_quietly"]

logger = logging.getLogger(__name__)


def pressure_of(record: t.StepRecord) -> dict[str, float]:
    """Rollout pressure inputs the trainer put into its step record's metrics (absent:
    none; the codec only lets numbers into the metrics)."""
    return {key: float(record.metrics[key]) for key in ("queue_pressure", "active_pressure")
            if key in record.metrics}


class ElasticLoop:
    """One job's planner and executor; ``on_step`` never waits for a rollout instance."""

    def __init__(self, *, job_id: str, planner: ElasticPlanner, executor: ElasticExecutor,
                 events: EventSink, leases: Callable[[], Awaitable[list[t.Lease]]],
                 clock: Clock) -> None:
        self._job_id = job_id
        self._planner = planner
        self._executor = executor
        self._sink = events
        self._leases = leases
        self._clock = clock
        self._step = 0
        self._task: asyncio.Task[None] | None = None
        self._is_dirty = False
        self._last_signal: tuple[str, int] | None = None

    async def on_step(self, record: t.StepRecord) -> None:
        """Plan on this step's record and wake the background pass."""
        self._step = record.step
        workers = await self._leases()
        # The planner (planner/live.py) still reads the record's JSON shape.
        decision, signal = self._planner.observe(step_record_to_dict(record), workers,
                                                 pressure_of(record))
        if decision:  # every pass counts, news or not (dashboards take its rate)
            export_plan(self._job_id, decision)
        if decision and self._is_news(decision, signal):
            event = {"kind": "plan", "ts_ms": self._clock.now_ms(), "step": self._step,
                     "worker_id": "", "epoch": 0, **decision}
            await record_quietly(self._sink, self._job_id, event)
        if signal is not None:
            self._executor.set_signal(signal)
        self.wake()

    def _is_news(self, decision: dict[str, Any], signal: ElasticSignal | None) -> bool:
        """A plan event when the planner fired (a decision, applied or not) or the
        elastic signal changed; a step that only holds the same signal is not one."""
        key = (signal.action, signal.desired) if signal is not None else None
        changed, self._last_signal = key != self._last_signal, key
        return bool(decision.get("fired", True)) or changed

    def stop(self) -> None:
        """The job ended: release every hybrid worker in the background."""
        self._executor.stop()
        self.wake()

    def wake(self) -> None:
        """Run a pass now, or once more after the running one (passes never overlap)."""
        self._is_dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"elastic-{self._job_id}")

    async def idle(self) -> None:
        """Wait until no pass is running or pending (tests and shutdown)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        while self._is_dirty:
            self._is_dirty = False
            try:
                await self._executor.reconcile(self._step, await self._leases())
            except Exception:
                # A pass must not kill the loop: the next step's pass tries again.
                logger.exception("[elastic] pass failed job_id=%s step=%d", self._job_id,
                                 self._step)
