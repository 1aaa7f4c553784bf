"""The rollout core's side of the elastic pool: lending this instance to training.

``RolloutCore`` composes a :class:`Lender`. ``lend`` stops sampling, hands every
pinned trajectory back to the scheduler (its latest state in the tasks hash; the
scheduler re-queues it once the lease role leaves the rollout roles), takes the
``hybrid-joining`` role and runs the join (:class:`services.rollout.hybrid_join.HybridJoin`)
in the background. ``reclaim``, a failed or finished join, and a lost lease bring the
instance back to rollout. Role changes are compare-and-set on the lease epoch and never
interleave with lease renewals (``LeaseHolder.lock``).

Pure, like the core: the coordinator, the store and the gradient channel come in as
collaborators.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from libra import types as t
from libra.clock import Clock
from libra.errors import FailedPrecondition
from libra.limits import check_generation
from libra.training import channel as ch
from services.rollout.hybrid_join import ChannelOpener, HybridJoin, TrainerLoader
from services.rollout.loop_types import JobContext, LeaseHolder, RolloutSettings

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.api import CoordinatorApi
    from services.rollout.store_protocol import RolloutStore

logger = logging.getLogger(__name__)

# Grace beyond the tool deadline for the tool calls in flight when a lend starts.
HAND_BACK_SLACK_S = 1.0


class Lender:
    """Lend / reclaim of a hybrid-rollout instance (composed by ``RolloutCore``).

    It sees of the loop only what a hand-back needs: the job served (``job``), whether
    an engine call or a trajectory task is in flight (``busy``), and how to wake the
    loop when the instance serves rollouts again (``wake``)."""

    def __init__(self, settings: RolloutSettings, store: RolloutStore,
                 coordinator: CoordinatorApi, clock: Clock, held: LeaseHolder,
                 opener: ChannelOpener | None, load_trainer: TrainerLoader | None, *,
                 job: Callable[[], tuple[str, JobContext] | None],
                 busy: Callable[[], bool], wake: Callable[[], None]) -> None:
        self.settings = settings
        self._store = store
        self._coordinator = coordinator
        self._clock = clock
        self._held = held
        self._opener = opener
        self._load_trainer = load_trainer
        self._job = job
        self._busy = busy
        self._wake = wake
        self._generation = 0
        self._lent: tuple[HybridJoin, asyncio.Task] | None = None
        self.lending = False  # the loop takes no work and samples nothing

    @property
    def hybrid_phase(self) -> str:
        return self._lent[0].phase if self._lent else ""

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str) -> tuple[t.Lease, int]:
        """Stop sampling, hand the pinned trajectories back, become hybrid-joining and
        start the join in the background; returns (the new lease, trajectories handed)."""
        check_generation(generation, self._clock.now_ms())
        self._check_lendable(expected_epoch, generation)
        self._generation = generation
        self.lending = True
        try:
            handed = await self._hand_back()
            async with self._held.lock:
                lease = self._require_lease(expected_epoch)
                self._held.lease = await self._coordinator.change_worker_role(
                    lease.worker_id, lease.epoch, t.WorkerRole.HYBRID_JOINING)
        except BaseException:
            self.lending = False
            raise
        assert self._opener is not None and self._load_trainer is not None
        hello = ch.Hello(job_id, self._held.lease.worker_id, self._held.lease.epoch, generation)
        join = HybridJoin(hello, trainer_address, self._opener, self._load_trainer,
                          self._activate)
        self._lent = (join, asyncio.create_task(self._run_join(join)))
        logger.info("[lend] joining training job_id=%s epoch=%d handed_back=%d", job_id,
                    self._held.lease.epoch, handed)
        return self._held.lease, handed

    def _check_lendable(self, expected_epoch: int, generation: int) -> None:
        if self.settings.role is not t.WorkerRole.HYBRID_ROLLOUT or self._opener is None:
            raise FailedPrecondition(f"instance {self.settings.instance_id} is "
                                     f"{self.settings.role.value}; only hybrid-rollout "
                                     "instances are lent to training")
        if generation <= self._generation:
            raise FailedPrecondition(f"lend generation {generation} is not newer than "
                                     f"{self._generation}")
        if self._lent is not None or self.lending:
            raise FailedPrecondition(f"instance {self.settings.instance_id} is already lent")
        self._require_lease(expected_epoch)

    def _require_lease(self, expected_epoch: int) -> t.Lease:
        if self._held.lease is None or self._held.lease.epoch != expected_epoch:
            held = self._held.lease.epoch if self._held.lease else None
            raise FailedPrecondition(f"lease epoch is {held}, not {expected_epoch}")
        return self._held.lease

    async def _hand_back(self) -> int:
        """Give every pinned trajectory back to the scheduler with what it generated.

        The engine call in flight is aborted at a token boundary and tool calls in
        flight are let finish (bounded by the tool deadline), so each trajectory is
        handed over with its tokens, masks, log-probs and versions intact (an
        interrupted turn goes along and is resumed where the trajectory lands).
        A move decided but not yet handed off is dropped: moves are committed only by
        the handoff, so the scheduler still has the trajectory assigned here and
        re-queues it from the state written now.
        """
        served = self._job()
        if served is None:
            return 0
        job_id, ctx = served
        ctx.engine.abort()
        deadline_s = self._clock.now_s() + self.settings.tool_deadline_s + HAND_BACK_SLACK_S
        while self._busy() and self._clock.now_s() < deadline_s:
            await asyncio.sleep(0.01)
        actives = list(ctx.active.values())
        ctx.active.clear()
        for act in actives:
            await self._store.hand_back(act.state_to_hand_over(), self.settings.instance_id,
                                        act.entry.entry_id)
        await self._store.record_event(job_id, "trajectories_handed_back",
                                       instance=self.settings.instance_id,
                                       count=str(len(actives)))
        return len(actives)

    async def _activate(self) -> int:
        """The core offered activation: take the hybrid-training epoch (CAS)."""
        async with self._held.lock:
            assert self._held.lease is not None
            self._held.lease = await self._coordinator.change_worker_role(
                self._held.lease.worker_id, self._held.lease.epoch, t.WorkerRole.HYBRID_TRAINING)
            return self._held.lease.epoch

    async def _run_join(self, join: HybridJoin) -> None:
        try:
            await join.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure returns the worker to rollout
            join.phase, join.detach_reason = "failed", str(exc)
            logger.warning("[lend] join failed error=%s", exc)
        # Detached by the core, failed or the stream ended: serve rollouts again.
        await self._return_to_rollout(f"{join.phase}: {join.detach_reason}", cancel=False)

    async def reclaim(self, generation: int, reason: str) -> t.Lease:
        """Back to rollout: cancel a pending join or detach an active one."""
        check_generation(generation, self._clock.now_ms())
        if self._held.lease is None:
            raise FailedPrecondition(f"instance {self.settings.instance_id} holds no lease")
        if generation < self._generation:
            raise FailedPrecondition(f"reclaim generation {generation} is older than "
                                     f"{self._generation}")
        self._generation = generation
        await self._return_to_rollout(reason or "reclaimed", cancel=True)
        if self._held.lease is None:  # lost while returning; the loop re-registers
            raise FailedPrecondition(f"instance {self.settings.instance_id} lost its lease")
        return self._held.lease

    async def _return_to_rollout(self, reason: str, cancel: bool) -> None:
        lent, self._lent = self._lent, None
        if lent is not None and cancel:
            lent[1].cancel()
            await asyncio.gather(lent[1], return_exceptions=True)
        async with self._held.lock:
            await self._store.clear_inbox(self.settings.instance_id)
            lease = self._held.lease
            if lease is not None and lease.role in (t.WorkerRole.HYBRID_JOINING,
                                                    t.WorkerRole.HYBRID_TRAINING):
                self._held.lease = await self._coordinator.change_worker_role(
                    lease.worker_id, lease.epoch, t.WorkerRole.HYBRID_ROLLOUT)
        self.lending = False
        self._wake()
        if lent is not None:
            logger.info("[lend] back to rollout reason=%s steps_contributed=%d", reason,
                        lent[0].steps_contributed)

    async def end_lend(self, reason: str) -> None:
        """The lease is gone: stop the join without touching roles (re-register next)."""
        lent, self._lent = self._lent, None
        if lent is not None:
            lent[1].cancel()
            await asyncio.gather(lent[1], return_exceptions=True)
            logger.warning("[lend] ended reason=%s", reason)
        self.lending = False
