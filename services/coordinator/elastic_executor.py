"""The elastic executor: one pass turns the desired number of hybrid workers into lends
and reclaims of rollout instances (the rules are in ``elastic.py``'s docstring). Pure:
rollouts, events and time come in as collaborators."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from libra import types as t
from libra.clock import Clock
from libra.errors import LibraError
from libra.jobspec import ElasticSpec
from services.coordinator.elastic_protocols import (
    HOLD,
    ElasticSignal,
    EventSink,
    RolloutLending,
    record_quietly,
)

logger = logging.getLogger(__name__)

ROLLOUT_CAPABLE = (t.WorkerRole.CORE_ROLLOUT, t.WorkerRole.HYBRID_ROLLOUT)
# Slack over the RPC's own deadline before the executor stops waiting for an answer.
DEADLINE_SLACK_S = 1.0


@dataclass(slots=True)
class _Join:
    """A lend the instance acknowledged that has not activated yet."""

    generation: int
    lent_at_s: float
    epoch: int


class ElasticExecutor:
    """Reconciles hybrid workers with the desired count (one pass at a time)."""

    def __init__(self, *, job_id: str, spec: ElasticSpec,
                 rollouts: Callable[[str], RolloutLending], events: EventSink, clock: Clock,
                 trainer_address: str, rpc_deadline_s: float = 5.0) -> None:
        self._job_id = job_id
        self._spec = spec
        self._rollouts = rollouts
        self._sink = events
        self._clock = clock
        self._trainer_address = trainer_address
        self._rpc_deadline_s = rpc_deadline_s
        self._init_state()

    def _init_state(self) -> None:
        self._generation: dict[str, int] = {}
        self._joins: dict[str, _Join] = {}
        self._failed_at_step: dict[str, int] = {}
        self._signal: ElasticSignal | None = None
        self._hold_desired: int | None = None
        self._is_expired_reported = False
        self._is_stopped = False

    # -- inputs ------------------------------------------------------------------------

    def set_signal(self, signal: ElasticSignal) -> None:
        """Adopt a fresh planner signal (it replaces the previous one and its TTL)."""
        self._signal = signal
        self._hold_desired = None
        self._is_expired_reported = False

    def stop(self) -> None:
        """The job ended: from now on every pass releases everything."""
        self._is_stopped = True

    def generation(self, worker_id: str) -> int:
        return self._generation.get(worker_id, 0)

    def _desired(self, step: int, current: int) -> tuple[int, str]:
        signal = self._signal
        if self._is_stopped:
            return 0, "job_ended"
        if signal is None:
            return 0, "no_signal"
        if step >= signal.ttl_step:
            return 0, "signal_expired"
        if signal.action == HOLD:
            # Hysteresis: keep what was lent when the hold arrived.
            if self._hold_desired is None:
                self._hold_desired = current
            return self._hold_desired, signal.reason
        return max(0, signal.desired), signal.reason

    # -- one pass ----------------------------------------------------------------------

    async def reconcile(self, step: int, leases: list[t.Lease]) -> None:
        """One pass: observe the leases, time out joins, then join or release."""
        by_id = {lease.worker_id: lease for lease in leases}
        # 1) What happened to the joins we started (activated, rolled back, lost)?
        await self._observe_joins(step, by_id)
        # 2) Joins that did not activate in time go back to rollout.
        timed_out = await self._time_out_joins(step, by_id)
        joining = [x for x in leases if x.role is t.WorkerRole.HYBRID_JOINING
                   and x.worker_id not in timed_out]
        active = [x for x in leases if x.role is t.WorkerRole.HYBRID_TRAINING]
        current = len(joining) + len(active)
        desired, reason = self._desired(step, current)
        if reason == "signal_expired" and current and not self._is_expired_reported:
            self._is_expired_reported = True
            await self._emit("signal_expired", step, reason=reason,
                             ttl_step=self._signal.ttl_step if self._signal else 0)
        # 3) Move towards the desired count.
        if desired > current:
            await self._join(step, leases, desired - current, reason)
        elif desired < current:
            await self._release(step, joining, active, current - desired, reason)

    async def _observe_joins(self, step: int, by_id: dict[str, t.Lease]) -> None:
        for worker_id, join in list(self._joins.items()):
            lease = by_id.get(worker_id)
            if lease is not None and lease.role is t.WorkerRole.HYBRID_JOINING:
                continue
            del self._joins[worker_id]
            if lease is None:
                await self._fail(step, worker_id, join.epoch, "lease_lost")
            elif lease.role is t.WorkerRole.HYBRID_TRAINING:
                await self._emit("activated", step, worker_id=worker_id, epoch=lease.epoch,
                                 reason="joined", generation=join.generation)
            else:
                await self._fail(step, worker_id, lease.epoch, "rolled_back_by_worker")
        for lease in by_id.values():
            if lease.role is t.WorkerRole.HYBRID_JOINING and lease.worker_id not in self._joins:
                # A join this executor did not start (or a restart forgot): time it from now.
                self._joins[lease.worker_id] = _Join(self.generation(lease.worker_id),
                                                     self._clock.now_s(), lease.epoch)

    async def _time_out_joins(self, step: int, by_id: dict[str, t.Lease]) -> set[str]:
        """Reclaim joins older than ``join_timeout_s``; returns their worker ids."""
        now_s = self._clock.now_s()
        late = {w for w, j in self._joins.items()
                if now_s - j.lent_at_s >= self._spec.join_timeout_s}
        for worker_id in sorted(late):
            join = self._joins.pop(worker_id)
            self._failed_at_step[worker_id] = step
            await self._fail(step, worker_id, join.epoch, "timeout",
                             waited_s=round(now_s - join.lent_at_s, 3))
            await self._reclaim(step, by_id[worker_id], "join_timeout",
                                self._bump(worker_id))
        return late

    # -- join --------------------------------------------------------------------------

    async def _join(self, step: int, leases: list[t.Lease], need: int, reason: str) -> None:
        chosen, refusal = self._pick_lendable(step, leases, need)
        if refusal:
            kind = "join_refused" if not chosen else "join_limited"
            await self._emit(kind, step, reason=refusal, wanted=need, granted=len(chosen))
        await asyncio.gather(*(self._lend(step, lease, reason) for lease in chosen))

    def _pick_lendable(self, step: int, leases: list[t.Lease],
                       need: int) -> tuple[list[t.Lease], str]:
        """The instances to lend and, when fewer than ``need``, why."""
        capable = [x for x in leases if x.role in ROLLOUT_CAPABLE]
        reserve = max(1, self._spec.reserve_workers)  # rollout never drops to zero
        lendable = max(0, len(capable) - reserve)
        cooled = self._spec.plan_interval_steps  # a failed worker sits this long out
        candidates = sorted((x for x in leases if x.role is t.WorkerRole.HYBRID_ROLLOUT
                             and step - self._failed_at_step.get(x.worker_id, -cooled) >= cooled),
                            key=lambda x: x.worker_id)
        granted = min(need, lendable, len(candidates))
        chosen = candidates[:granted]
        if granted == need:
            return chosen, ""
        wanted = min(need, len(candidates))
        if lendable < wanted:
            return chosen, (f"lending {wanted} worker(s) would leave "
                            f"{len(capable) - wanted} rollout-capable worker(s) "
                            f"(have {len(capable)}, reserve_workers={reserve})")
        return chosen, (f"only {len(candidates)} hybrid-rollout worker(s) can be lent, "
                        f"{need} wanted")

    async def _lend(self, step: int, lease: t.Lease, reason: str) -> None:
        generation = self._bump(lease.worker_id)
        await self._emit("join_requested", step, worker_id=lease.worker_id,
                         epoch=lease.epoch, reason=reason, generation=generation)
        try:
            reply = await self._bounded(self._rollouts(lease.address).lend(
                self._job_id, lease.epoch, generation, self._trainer_address,
                timeout_s=self._rpc_deadline_s))
        except (LibraError, TimeoutError) as exc:
            self._failed_at_step[lease.worker_id] = step
            await self._fail(step, lease.worker_id, lease.epoch,
                             f"no_ack: {type(exc).__name__}: {exc}")
            await self._reclaim(step, lease, "join_not_acknowledged",
                                self._bump(lease.worker_id))
            return
        self._joins[lease.worker_id] = _Join(generation, self._clock.now_s(),
                                             reply.lease.epoch)
        await self._emit("join_acked", step, worker_id=lease.worker_id,
                         epoch=reply.lease.epoch, reason=reason, generation=generation,
                         handed_back=reply.num_handed_back)

    async def _reclaim(self, step: int, lease: t.Lease, reason: str,
                       generation: int) -> None:
        """Return an instance to rollout at ``generation`` (best effort: a failure is
        recorded, and a later pass tries again while the instance is still lent)."""
        try:
            back = await self._bounded(self._rollouts(lease.address).reclaim(
                generation, reason, timeout_s=self._rpc_deadline_s))
        except (LibraError, TimeoutError) as exc:
            await self._emit("release_failed", step, worker_id=lease.worker_id,
                             epoch=lease.epoch, reason=f"{reason}: {type(exc).__name__}: "
                             f"{exc}", generation=generation)
            return
        await self._emit("released", step, worker_id=lease.worker_id, epoch=back.epoch,
                         reason=reason, generation=generation)

    # -- release -----------------------------------------------------------------------

    async def _release(self, step: int, joining: list[t.Lease], active: list[t.Lease],
                       excess: int, reason: str) -> None:
        # Cancel joins first (newest first: least work lost), then detach active ones.
        def lent_at(lease: t.Lease) -> float:
            join = self._joins.get(lease.worker_id)
            return join.lent_at_s if join else 0.0

        order = (sorted(joining, key=lent_at, reverse=True)
                 + sorted(active, key=lambda x: x.worker_id, reverse=True))
        await asyncio.gather(*(self._release_one(step, lease, reason)
                               for lease in order[:excess]))

    async def _release_one(self, step: int, lease: t.Lease, reason: str) -> None:
        self._joins.pop(lease.worker_id, None)
        generation = self._bump(lease.worker_id)  # makes a pending join stale at once
        await self._emit("release_requested", step, worker_id=lease.worker_id,
                         epoch=lease.epoch, reason=reason, generation=generation,
                         role=lease.role.value)
        await self._reclaim(step, lease, reason, generation)

    # -- helpers -----------------------------------------------------------------------

    def _bump(self, worker_id: str) -> int:
        # Starting from wall-clock ms keeps generations increasing across coordinator
        # restarts, so a rollout instance can always refuse an older one.
        generation = max(self.generation(worker_id) + 1, self._clock.now_ms())
        self._generation[worker_id] = generation
        return generation

    async def _bounded(self, call: Awaitable[Any]) -> Any:
        # The RPC has its own deadline; this guard also covers a peer that never answers.
        async with asyncio.timeout(self._rpc_deadline_s + DEADLINE_SLACK_S):
            return await call

    async def _fail(self, step: int, worker_id: str, epoch: int, reason: str,
                    **extra: Any) -> None:
        await self._emit("join_failed", step, worker_id=worker_id, epoch=epoch,
                         reason=reason, **extra)

    async def _emit(self, kind: str, step: int, *, worker_id: str = "", epoch: int = 0,
                    reason: str = "", **extra: Any) -> None:
        event = {"ts_ms": self._clock.now_ms(), "kind": kind, "step": step,
                 "worker_id": worker_id, "epoch": epoch, "reason": reason, **extra}
        logger.info("[elastic] job_id=%s kind=%s step=%d worker_id=%s epoch=%d reason=%s",
                    self._job_id, kind, step, worker_id, epoch, reason)
        await record_quietly(self._sink, self._job_id, event)
