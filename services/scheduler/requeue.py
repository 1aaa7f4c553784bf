"""Re-queueing of trajectories whose instance is gone, or of a resumed job (pure)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from libra import types as t
from libra.clock import Clock
from scheduling.policy.errors import UnknownTrajectory
from scheduling.policy.load_index import LoadIndex
from services.scheduler.job_run import JobRun
from services.scheduler.state import LeaseSnapshot

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.scheduler.store_protocol import SchedulerStore

logger = logging.getLogger("services.scheduler.core")

# Period of the sweep for trajectories pinned to instances that are gone (a safety net:
# a change in the set of live instances is scanned for at once).
ORPHAN_SCAN_S = 2.0
# Assignments read per tick by a sweep after an instance left: at 100,000 in flight one
# HGETALL took a tick past 100 ms (Redis and this process both). A page of 2,000 made
# the sweep's ticks the slowest of a steady run at 1,000 instances (20-55 ms of the
# tick's own CPU on a busy host, session 15): 1,000 bounds that, and the gone
# instance's work is re-queued within 100 ticks (5-10 s), after a TTL of ~12 s there.
ORPHAN_SCAN_PAGE = 1000
# The periodic sweep's page (nothing left: the safety net). At 100,000 in flight a sweep
# never ends before the next is due, so this is read at every tick: a page of 2,000 was
# most of a steady tick's own work (100 kB to read and decode, cProfile); 250 sweep
# 100,000 in 400 ticks (20 s at 20 ticks a second).
ORPHAN_SAFETY_PAGE = 250


def _page_size(run: JobRun) -> int:
    return ORPHAN_SCAN_PAGE if run.departed else ORPHAN_SAFETY_PAGE


def _sweep_due(run: JobRun, now_s: float) -> bool:
    """A sweep is under way (its cursor is past the start) or the next one is due."""
    return bool(run.orphan_cursor) or now_s - run.last_orphan_scan_s >= ORPHAN_SCAN_S


class Requeuer:
    """Puts trajectories back in the job's queue (needs the store and a clock)."""

    def __init__(self, store: SchedulerStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    def page_due(self, run: JobRun) -> tuple[int, int] | None:
        """The sweep's next page (cursor, count) when one is due now, else None: the tick
        reads it with its state, in the same round trip."""
        if _sweep_due(run, self._clock.now_s()):
            return run.orphan_cursor, _page_size(run)
        return None

    async def requeue_orphans(self, run: JobRun,
                              page: tuple[int, dict[str, str]] | None = None) -> None:
        """Re-queue what is assigned to instances no longer live for placements, then
        save the epochs placements are made under. ``page``: the sweep's page read by
        the tick (``page_due``); read here when due and not given."""
        await self._sweep(run, page)
        # After the sweep's re-queues and before the tick's placements: a new epoch is
        # saved only once nothing of the old one is assigned, and before anything is
        # placed under it (a restarted scheduler compares with what was saved).
        await self._save_epochs(run)

    async def save_epochs_seen_first(self, run: JobRun, snapshot: LeaseSnapshot) -> None:
        """Save the epochs of instances ``snapshot`` shows first (``JobRun.
        epochs_seen_first``), before it is taken in and can route anything to them."""
        first = run.epochs_seen_first(snapshot.instances, snapshot.epochs)
        if first:
            await self._store.update_placement_epochs(run.job_id, first, [])
            run.saved_epochs = {**run.saved_epochs, **first}

    async def _save_epochs(self, run: JobRun) -> None:
        """Write the changes of ``JobRun.epochs_to_save`` (none in a steady state)."""
        if not run.epochs_dirty:
            return
        want = run.epochs_to_save()
        changed = {iid: epoch for iid, epoch in want.items()
                   if run.saved_epochs.get(iid) != epoch}
        gone = [iid for iid in run.saved_epochs if iid not in want]
        if changed or gone:
            await self._store.update_placement_epochs(run.job_id, changed, gone)
        run.saved_epochs, run.epochs_dirty = want, False

    async def _sweep(self, run: JobRun, page: tuple[int, dict[str, str]] | None) -> None:
        # Gone: no lease, or a lease whose role is no longer a rollout role (lent to
        # training: the instance hands back its trajectories' state and they re-queue).
        live = (run.instances.ids if isinstance(run.instances, LoadIndex)
                else {inst.instance_id for inst in run.instances})
        # Reading every assignment is the costly part of a tick: they are swept a page
        # per tick, a sweep every ORPHAN_SCAN_S as a safety net, and at once (a sweep
        # from the start, this tick) when an instance left the live set. That used to be
        # one HGETALL of all of them: 100,000 at 1,000 instances, tens of ms of Redis
        # and of this process at every lease that lapsed or came back, which under churn
        # was the tick's largest cost (cProfile). A sweep takes a page a tick, so a gone
        # instance's work is re-queued within ``assignments / ORPHAN_SCAN_PAGE`` ticks
        # (one below 2,000 in flight), after its TTL (seconds) has run out anyway.
        # An instance that left is "departed" until a sweep started after it left has
        # ended: its work is re-queued from every page, even once it is back with a new
        # lease (it dropped that work when the lease was lost), and it gets no
        # placement meanwhile (``departed`` is left out of the snapshot's instances),
        # so its load counts only the assignments not yet re-queued. An instance seen
        # under a new lease epoch (restarted within its TTL: never out of the live set)
        # is made departed by the snapshot (``JobRun.note_epochs``), so it leaves
        # ``live`` here and is handled the same way.
        now_s = self._clock.now_s()
        if live is not run.last_live and live != run.last_live:
            gone = run.last_live - live  # not for instances that only joined
            run.last_live = live
            if gone:
                run.departed |= gone
                run.orphan_cursor, run.last_orphan_scan_s, page = 0, float("-inf"), None
        if not _sweep_due(run, now_s):
            return
        if not run.orphan_cursor:
            run.last_orphan_scan_s = now_s
        run.orphan_cursor, assigned = page or await self._store.assignments_page(
            run.job_id, run.orphan_cursor, _page_size(run))
        orphaned: dict[str, list[str]] = {}
        for traj_id, instance_id in assigned.items():
            if instance_id not in live or instance_id in run.departed:
                orphaned.setdefault(instance_id, []).append(traj_id)
        if not run.orphan_cursor:  # the sweep ended: every departed one was swept
            run.epochs_dirty |= bool(run.departed)
            run.departed = set()
        await self._store.forget_instances(run.job_id, list(orphaned))
        for instance_id, traj_ids in orphaned.items():
            logger.warning(
                "[requeue] instance lost its lease, left the rollout roles or restarted "
                "instance_id=%s trajectories=%d",
                instance_id,
                len(traj_ids),
            )
        # One re-queue for the page's orphans of every instance (two round trips; with
        # the inboxes' DEL above, three a page), not three per instance: a page held
        # those of ~10 gone instances at once when 10 died.
        await self.requeue_many(run, [traj_id for traj_ids in orphaned.values()
                                      for traj_id in traj_ids])

    async def requeue_all(self, run: JobRun) -> None:
        """A resumed job: when it ended, the rollout instances dropped its trajectories
        (acked, never published), so everything assigned goes back to the queue and its
        loads restart from zero. A copy still unread in an inbox may run too; the
        trainer keeps one copy per trajectory id (duplicates are acked, not trained)."""
        assigned = await self._store.assignments(run.job_id)
        await self.requeue_many(run, list(assigned))
        await self._store.clear_load(run.job_id)
        logger.info("[job] resumed job_id=%s requeued=%d", run.job_id, len(assigned))

    async def requeue_many(self, run: JobRun, traj_ids: list[str]) -> None:
        """``requeue`` for many: one read of their tasks and one write."""
        if not traj_ids:
            return
        back = []
        for traj_id, traj in zip(traj_ids, await self._store.tasks_of(run.job_id, traj_ids),
                                 strict=True):
            try:
                run.policy.abort(t.TrajectoryId(traj_id))
            except UnknownTrajectory:
                pass
            if traj is None:
                await self._store.release(run.job_id, traj_id)  # its slot too
                continue
            traj.attempt += 1
            back.append(traj)
        requeued = set(await self._store.requeue_many(run.job_id, back))
        if run.pending is not None:
            run.pending.update((traj.trajectory_id, traj) for traj in back
                               if traj.trajectory_id in requeued)

    async def requeue(self, run: JobRun, traj_id: str) -> None:
        """One trajectory back to the queue (its attempt counted); forgotten when its
        task is gone."""
        await self.requeue_many(run, [traj_id])
