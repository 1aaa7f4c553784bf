"""Scheduler core: admission control and placement of trajectories (pure).

Per running job the core (1) re-places trajectories whose instance lost its lease,
(2) admits prompt groups while the staleness budget allows, (3) places admitted
trajectories with the job's placement policy (least-loaded, C-MLFQ, ...), keeping the
ones that find no capacity queued here - never unboundedly on one instance.

Staleness budget (cumulative counters, no double counting): a new group is admitted only
while ``admitted_groups - consumed_groups < (max_staleness + 1) * prompts_per_step``,
where consumed groups are those the trainer trained on or dropped.

Held-out eval (``task.eval_interval``): when the job's step reaches an eval round, the
tick admits the round's tagged trajectories ahead of training groups and outside the
staleness budget (services/scheduler/evaluation.py, libra/evaluation.py).

Policy state (C-MLFQ's prefix tree and recent ring, pinned trajectories) lives in a
per-job write-behind store: policy calls are synchronous on its cache, and every tick
writes what changed together with its placements, so a restarted scheduler reloads it at
``start_job``. Training steps are observed through the job's ``step`` field (written by
the coordinator when the trainer reports a step); each advance calls
``policy.on_step_end``.

Cost per trajectory is kept to a few batched round trips: tool returns arrive in batches
(one stream message per rollout instance per burst, decided in memory), finishes are read
from the job's trajectory stream once per tick (no RPC per trajectory), and a tick is one
read (status, counters, finishes given back, leases when due) and at most one write
(placements, admissions and the policy's state), which ``store.py`` describes.

Moves (decided here, committed by the rollout instance's handoff) and the fencing of
reports by lease epoch: ``reports.py``. Only instances whose lease role is a rollout role
receive placements; what is assigned to an instance whose lease is gone, whose role
left the rollout roles or whose lease epoch changed (a restart) is re-queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from libra import types as t
from libra.cancellation import raise_if_cancelled
from libra.clock import Clock
from libra.data import open_job_dataset
from libra.errors import FailedPrecondition, LibraError, NotFound
from libra.evaluation import eval_rows, eval_steps
from libra.jobspec import job_spec_from_json
from libra.step_timing import StepTimes, timed
from scheduling.policy.registry import check_layout, make_policy
from services.scheduler.admission import Admission
from services.scheduler.job_run import (
    JobGauges,
    JobRun,
    ToolReturnReport,
    apply_local_load,
    build_layout,
    build_policy_config,
    gauges_of,
)
from services.scheduler.placement import assign, check_idle
from services.scheduler.reports import LeaseFence, apply_finishes, decide, learn_finish
from services.scheduler.requeue import ORPHAN_SCAN_S, Requeuer
from services.scheduler.state import LeaseSnapshot, TickWrites
from services.scheduler.tick_gate import TickGate

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.scheduler.store_protocol import SchedulerStore

# Re-exported: other services, tests and the simulator import these from the core.
__all__ = ["MAX_FINISHES_PER_TICK", "MAX_PLACED_PER_TICK", "ORPHAN_SCAN_S", "JobRun",
           "SchedulerCore", "ToolReturnReport", "build_layout", "build_policy_config"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Finished trajectories taken from the job's stream per tick (the rest wait a tick).
MAX_FINISHES_PER_TICK = 1024
# Trajectories a tick places or admits at most (the rest wait a tick): filling 1,000
# instances at once was one tick of 100,000 placements - minutes without a decision
# served, and one write that held Redis for seconds. Routing is a lookup in the
# snapshot's LoadIndex (~10 us per placement at any fleet size; a scan was ~0.3 ms at
# 1,000 instances): the cap now bounds the tick's write and the reports it delays.
MAX_PLACED_PER_TICK = 128
# Report batches let through while the tick awaits one of its Redis round trips (read
# or write): ~0.3 ms of CPU each, so at most ~5 ms added to the tick's wall time per
# await, while its p99 had ~60 ms of slack at 1,000 instances (``tick_gate.py``).
REPORTS_PER_TICK_AWAIT = 16
# The least age at which a report re-reads the lease snapshot itself (see __init__).
MIN_STALE_SNAPSHOT_S = 2.0


class SchedulerCore:
    """Admission control and placement for every running job."""

    def __init__(self, store: SchedulerStore, clock: Clock, tick_s: float = 0.05,
                 lease_snapshot_s: float = 0.0,
                 observe_tick: Callable[[float, StepTimes], None] | None = None) -> None:
        """``lease_snapshot_s``: how often a tick re-reads leases and loads (0: every
        tick). Loads are kept in memory between reads - this process is their only
        writer - so the period only delays noticing a lease that came or went.
        ``observe_tick`` receives each job's tick: its wall time in seconds, which
        counts the reports served while the tick awaited Redis, and the tick's own
        steps' wall and CPU time, which do not (``libra/step_timing.py``; the service's
        histograms: the core itself imports no metrics library)."""
        self._store = store
        self._observe_tick = observe_tick
        self._clock = clock
        self._tick_s = tick_s
        self._lease_snapshot_s = lease_snapshot_s
        # A report finding the snapshot older than this re-reads it (the loop is behind).
        # Not under MIN_STALE_SNAPSHOT_S: loads are kept here between snapshots, so a
        # stale one only misses leases that came or went, which TTLs of seconds delay
        # anyway; at 1,000 instances with ticks late by 0.5 s, reports re-read all 1,000
        # leases 1,117 times in a run (a fifth of the scheduler's time, cProfile).
        self._snapshot_stale_s = max(4 * tick_s, 2 * lease_snapshot_s, MIN_STALE_SNAPSHOT_S)
        self._jobs: dict[str, JobRun] = {}
        self._stopping = False
        # Closed while a tick computes, ajar while it awaits Redis (``tick_done``).
        self._gate = TickGate(REPORTS_PER_TICK_AWAIT)
        # Lease epoch of every live worker as of the last lease snapshot (fencing).
        self._fence = LeaseFence(store)
        # Collaborators with narrow state: admission needs the clock, re-queueing the store.
        self._admission = Admission(clock)
        self._requeuer = Requeuer(store, clock)

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Schedule a job. ``resume``: the job ended (cancelled, failed) and is resumed;
        admission continues from its counters in Redis either way."""
        spec_json = await self._store.job_spec_json(job_id)
        if spec_json is None:
            raise NotFound(f"job {job_id!r} not found")
        if job_id in self._jobs:
            return
        spec = job_spec_from_json(spec_json)
        # Checked at submit too; a stored spec may predate a policy's removal.
        check_layout(spec.layout)
        # Off the event loop: a file dataset's first open converts it to Arrow (seconds
        # for millions of rows; the coordinator's check usually did it already).
        dataset = await asyncio.to_thread(open_job_dataset, spec.task)
        # What a previous scheduler process left (tree, ring, pinned trajectories).
        policy_store = await self._store.open_policy_store(job_id)
        policy = make_policy(spec.layout.policy, build_layout(spec),
                             config=build_policy_config(spec), store=policy_store)
        last_step = await self._store.job_step(job_id)
        saved_epochs = await self._store.placement_epochs(job_id)  # job_run.note_epochs
        await self._store.ensure_finish_group(job_id)
        task = spec.task
        steps = eval_steps(spec.algorithm.num_steps, task.eval_interval)
        rows = await asyncio.to_thread(eval_rows, dataset.eval, task.eval_max_prompts) \
            if steps else []
        if steps and not rows:  # the submit check renders eval rows: not expected
            logger.warning("[eval] no held-out row renders: no eval round will run "
                           "job_id=%s", job_id)
        if job_id in self._jobs:  # started concurrently meanwhile
            return
        run = JobRun(job_id, spec, policy, policy_store, dataset.train, last_step=last_step,
                     eval_steps=steps, eval_rows=rows, saved_epochs=saved_epochs)
        if resume:
            await self._requeuer.requeue_all(run)
        self._jobs[job_id] = run
        logger.info(
            "[job] scheduling job_id=%s policy=%s buckets=%s step=%d",
            job_id,
            spec.layout.policy,
            [b.name for b in spec.layout.buckets],
            last_step,
        )

    async def stop_job(self, job_id: str) -> None:
        """Forget the job here (cancel, failure or end); the store keeps its state for a
        resume."""
        if self._jobs.pop(job_id, None) is not None:
            logger.info("[job] stopped scheduling job_id=%s", job_id)

    def _run(self, job_id: str) -> JobRun:
        run = self._jobs.get(job_id)
        if run is None:
            raise FailedPrecondition(f"job {job_id!r} is not being scheduled")
        return run

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Admit and place until stopped; one pass per tick for every job."""
        for job_id in await self._store.running_jobs():
            # A restarted scheduler picks up where the previous process stopped.
            await self.start_job(job_id)
        while not self._stopping:
            raise_if_cancelled()
            is_capped = False
            for run in list(self._jobs.values()):
                began_s, own = self._clock.now_s(), StepTimes()
                self._gate.tick_started()
                try:
                    is_capped |= await timed(self._tick(run), own)
                except Exception:
                    logger.exception("[loop] tick failed job_id=%s", run.job_id)
                finally:
                    self._gate.tick_ended()
                if self._observe_tick is not None:
                    self._observe_tick(self._clock.now_s() - began_s, own)
            # A tick that stopped at MAX_PLACED_PER_TICK has more to place: the next one
            # runs as soon as the reports waiting meanwhile were served (sleep(0) lets
            # them in), not a period later. Filling 1,000 instances to 100,000 took one
            # 128-placement tick per (tick + 50 ms): 21k-80k in 240 s.
            await asyncio.sleep(0 if is_capped else self._tick_s)

    async def drain(self, _grace_s: float) -> None:
        """Stop the loop after the current pass (SIGTERM); the state is in the store, so
        a restarted scheduler picks the jobs up."""
        self._stopping = True

    async def _tick(self, run: JobRun) -> bool:
        """One pass for the job; True when it stopped at ``MAX_PLACED_PER_TICK`` with
        more to place (``TickWrites.is_capped``)."""
        # One read (status, counters, finishes given back, leases when due) and one
        # write (placements, admissions, policy state): see ``store.py``.
        with_leases = self._clock.now_s() - run.instances_at_s >= self._lease_snapshot_s
        status = await self._redis_wait(self._store.tick_state(
            run.job_id, run.finish_cursor, MAX_FINISHES_PER_TICK, with_leases,
            self._requeuer.page_due(run)))
        if status.state is None or status.state in ("succeeded", "failed", "cancelled"):
            await run.policy_store.flush()
            await self.stop_job(run.job_id)
            return False
        # 1) A training step ended: rebuild / snapshot the policy's model.
        self._observe_steps(run, status.step)
        # 2) The policy learns from finished trajectories (their slots were given back
        #    by the read, before the orphan scan: a finished one is never re-queued).
        apply_finishes(run, status.finishes)
        if status.leases is not None:  # read after the slots were given back
            await self._take_snapshot(run, status.leases)
        # 3) Trajectories on instances whose lease expired go back to the queue.
        await self._requeuer.requeue_orphans(run, status.orphan_page)
        writes = TickWrites()
        # 4) Place what is queued (re-queued first, then by policy priority).
        await self._place_pending(run, writes)
        # 5) An eval round that came due (outside the staleness budget; first in line),
        #    then groups while the staleness budget allows and the instances take them
        #    (weights must exist first).
        if status.published and run.eval_steps:
            self._admission.admit_eval(run, status.step, status.counters, writes)
        if not run.pending and status.published:
            self._admission.admit(run, status.counters, writes,
                                  MAX_PLACED_PER_TICK - len(writes.placed_from_pending))
        # 6) Write what the tick decided, with what the policy changed.
        try:
            await self._redis_wait(self._store.commit_tick(run.job_id, writes,
                                                           run.policy_store))
        except Exception:
            # Nothing was written: re-read the queue and the loads before deciding again.
            run.pending, run.instances_at_s = None, float("-inf")
            raise
        return writes.is_capped

    async def _redis_wait(self, call: Awaitable[T]) -> T:
        """Await one of the tick's two round trips with the gate ajar: report batches
        decided meanwhile read and change only what reports may change between ticks
        (the policy's state and the loads in memory; the write took its values before
        it was sent), so the tick's read and write are the same with or without them."""
        self._gate.tick_awaits()
        try:
            return await call
        finally:
            self._gate.tick_resumed()

    def _observe_steps(self, run: JobRun, step: int) -> None:
        while run.last_step < step:
            run.last_step += 1
            run.policy.on_step_end(run.last_step)
            logger.debug("[step] on_step_end job_id=%s step=%d", run.job_id, run.last_step)

    def _make_group(self, run: JobRun, group_index: int) -> list[t.Trajectory]:
        return self._admission.make_group(run, group_index)

    async def _place_pending(self, run: JobRun, writes: TickWrites) -> None:
        if run.pending is None:
            run.pending = {traj.trajectory_id: traj
                           for traj in await self._store.pending(run.job_id)}
        if not run.pending:
            run.idle_while_queued = ()
            return
        placed = assign(run, list(run.pending.values()), run.instances,
                        limit=MAX_PLACED_PER_TICK)
        for traj in placed:
            del run.pending[traj.trajectory_id]
        check_idle(run)
        writes.placed_from_pending += placed
        # Placed up to the cap with more queued: the queue may fit more next pass.
        writes.is_capped |= len(placed) == MAX_PLACED_PER_TICK and bool(run.pending)

    async def _refresh_instances(self, run: JobRun) -> None:
        await self._take_snapshot(run, await self._store.lease_snapshot(run.job_id))

    async def _refresh_if_stale(self, run: JobRun) -> None:
        """Re-read leases and loads when the loop is behind: one read for every report
        that finds the snapshot stale at once (they wait for it), not one each."""
        if self._clock.now_s() - run.instances_at_s <= self._snapshot_stale_s:
            return
        async with run.refresh_lock:
            if self._clock.now_s() - run.instances_at_s > self._snapshot_stale_s:
                await self._refresh_instances(run)

    async def _take_snapshot(self, run: JobRun, snapshot: LeaseSnapshot) -> None:
        # The epoch of an instance seen first is saved before anything can route to it
        # (a move decided on the report path, before the next tick saves epochs).
        await self._requeuer.save_epochs_seen_first(run, snapshot)
        run.set_instances(snapshot.instances, self._clock.now_s(), snapshot.epochs)
        self._fence.take(snapshot.epochs)

    # -- RPCs from rollout instances -----------------------------------------------------

    async def tick_done(self) -> None:
        """Wait until no tick computes (at once when none runs, or when the running
        one awaits Redis and lets this batch through). The servicer calls it before
        deciding a report batch.

        The tick and the reports share one event loop, and the reply to each of the
        tick's Redis calls was taken only after every report batch queued before it: at
        1,000 instances the niced fleet sends them in bursts of hundreds (0.2-0.4 ms of
        CPU each), so the tick's wall time was mostly theirs (p99 126-578 ms against its
        own 15-47 ms, session 16). Parked here, a batch costs the tick a few us; the
        batches still parked when the tick ends run, in their order, before the next
        tick starts (woken ahead of the loop's next pass). While the tick awaits its
        read or its write the loop is otherwise idle: the gate is ajar then, and up to
        ``REPORTS_PER_TICK_AWAIT`` batches (the oldest parked first) are decided during
        each of the two awaits (session 17, ``tick_gate.py``), so a batch waits for the
        tick's own steps rather than its round trips, and the tick pays at most that
        many batches' CPU per await. The servicer times the wait apart:
        ``libra_scheduler_report_tick_wait_seconds``."""
        await self._gate.wait()

    async def check_fence(self, instance_id: str, epoch: int) -> None:
        """Refuse a report whose epoch is not the instance's current lease epoch."""
        await self._fence.check(instance_id, epoch)

    async def report_tool_returns(
        self, instance_id: str, epoch: int, reports: list[ToolReturnReport]
    ) -> list[t.PlacementDecision | LibraError]:
        """Decide every report of one batch (fenced as a whole); per report a decision,
        or the error of that report alone (its job is not scheduled here)."""
        await self.check_fence(instance_id, epoch)
        out: list[t.PlacementDecision | LibraError] = []
        for report in reports:
            run = self._jobs.get(report.job_id)
            if run is None:
                out.append(FailedPrecondition(f"job {report.job_id!r} is not being scheduled"))
                continue
            await self._refresh_if_stale(run)  # the loop is behind: read fresh loads
            out.append(decide(run, report))
        return out

    async def report_tool_return(
        self, job_id: str, traj_id: str, state: t.ToolReturnState, tokens_so_far: int
    ) -> t.PlacementDecision:
        """One report, unfenced (callers in this process; the servicer fences first)."""
        run = self._run(job_id)
        await self._refresh_if_stale(run)
        return decide(run, ToolReturnReport(job_id, traj_id, state, tokens_so_far))

    async def report_finished(
        self, job_id: str, traj_id: str, total_tokens: int, status: t.TrajectoryStatus
    ) -> None:
        """One finish reported directly (older rollouts; the tick reads the stream).
        The slot goes back by assignment in one round trip; the policy learns in memory
        and its store is flushed with the next tick."""
        instance_id = await self._store.release(job_id, traj_id)
        run = self._jobs.get(job_id)
        if run is None or instance_id is None:
            return  # not scheduled here, or re-queued meanwhile (its slot is given back)
        learn_finish(run, traj_id, total_tokens, status)
        apply_local_load(run, ((instance_id, -1),))

    def gauges(self) -> list[JobGauges]:
        """Every scheduled job's figures as of its last tick (read by /metrics)."""
        return [gauges_of(run) for run in list(self._jobs.values())]

    async def stats(self, job_id: str) -> dict[str, Any]:
        """The job's placement figures for ``libra status``: policy, pending work,
        decisions, migrations."""
        run = self._run(job_id)
        return {
            "policy": run.spec.layout.policy,
            "pending": len(run.pending or {}),
            "decisions": dict(run.decisions),
            "migrations": run.migrations,
            "skipped_rows": run.num_skipped_rows,
            "counters": await self._store.counters(job_id),
            "policy_stats": run.policy.stats(),
        }

