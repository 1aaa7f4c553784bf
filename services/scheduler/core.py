"""Scheduler core: admission control and placement of trajectories (pure).

Per running job the core (1) re-places trajectories whose instance lost its lease,
(2) admits prompt groups while the staleness budget allows, (3) places admitted
trajectories with the job's placement policy (least-loaded, C-MLFQ, ...), keeping the
ones that find no capacity queued here - never unboundedly on one instance.

Staleness budget (cumulative counters, no double counting): a new group is admitted only
while ``admitted_groups - consumed_groups < (max_staleness + 1) * prompts_per_step``,
where consumed groups are those the trainer trained on or dropped.

Policy state (C-MLFQ's prefix tree and recent ring, pinned trajectories) lives in a
per-job write-behind store: policy calls are synchronous on its cache, and the core
flushes it after every call and tick, so a restarted scheduler reloads it at
``start_job``. Training steps are observed through the job's ``step`` field (written by
the coordinator when the trainer reports a step); each advance calls
``policy.on_step_end``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from libra import types as t
from libra.clock import Clock
from libra.errors import FailedPrecondition, NotFound
from libra.ids import group_id, trajectory_id
from libra.jobspec import JobSpec, job_spec_from_json
from libra.tasks.arith import ArithDataset, Problem
from services.scheduler.policy.base import PlacementPolicy, TrajectoryDescriptor
from services.scheduler.policy.cmlfq import CmlfqConfig
from services.scheduler.policy.errors import UnknownTrajectory
from services.scheduler.policy.layout import BucketLayout
from services.scheduler.policy.registry import PolicyConfig, make_policy

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.scheduler.store import FlushablePolicyStore, SchedulerStore

logger = logging.getLogger(__name__)

# Period of the full scan for trajectories pinned to instances that are gone.
ORPHAN_SCAN_S = 2.0


@dataclass
class JobRun:
    """What the scheduler holds for one running job."""

    job_id: str
    spec: JobSpec
    policy: PlacementPolicy
    policy_store: FlushablePolicyStore
    problems: list[Problem]
    last_step: int = 0
    order: list[int] = field(default_factory=list)
    next_group: int = 0
    num_pending: int = 0
    decisions: collections.Counter[str] = field(default_factory=collections.Counter)
    migrations: int = 0
    # Live instances and loads as of the last tick: decisions at tool returns route
    # from this snapshot instead of reading Redis on the request path.
    instances: list[t.InstanceLoad] = field(default_factory=list)
    instances_at_s: float = -1.0
    last_live: set[str] = field(default_factory=set)
    last_orphan_scan_s: float = float("-inf")


def build_policy_config(spec: JobSpec) -> PolicyConfig | None:
    """The policy's config from the spec (``[layout.cmlfq]``); ``None`` for defaults."""
    if spec.layout.policy != "cmlfq":
        return None
    c = spec.layout.cmlfq
    return CmlfqConfig(
        rebuild_interval_steps=c.rebuild_interval_steps,
        recent_window_trajectories=c.recent_window_trajectories,
        p90_window_samples=c.p90_window_samples,
        tree_persist_interval_finishes=c.tree_persist_interval_finishes,
        min_node_visits=c.min_node_visits,
        bucket_thresholds_tokens=tuple(c.bucket_thresholds_tokens) or None,
        enable_fallback=c.enable_fallback,
    )


def build_layout(spec: JobSpec) -> BucketLayout:
    return BucketLayout(
        [
            t.Bucket(
                b.name, b.max_tokens, b.tp_degree, b.max_batch_size, b.max_trajectories_per_instance
            )
            for b in spec.layout.buckets
        ]
    )


class SchedulerCore:
    """Admission control and placement for every running job."""

    def __init__(self, store: SchedulerStore, clock: Clock, tick_s: float = 0.05) -> None:
        self._store = store
        self._clock = clock
        self._tick_s = tick_s
        self._jobs: dict[str, JobRun] = {}
        self._stopping = False

    async def start_job(self, job_id: str) -> None:
        spec_json = await self._store.job_spec_json(job_id)
        if spec_json is None:
            raise NotFound(f"job {job_id!r} not found")
        if job_id in self._jobs:
            return
        spec = job_spec_from_json(spec_json)
        dataset = ArithDataset(spec.task.seed, spec.task.num_prompts)
        # What a previous scheduler process left (tree, ring, pinned trajectories).
        policy_store = await self._store.open_policy_store(job_id)
        policy = make_policy(spec.layout.policy, build_layout(spec),
                             config=build_policy_config(spec), store=policy_store)
        last_step = await self._store.job_step(job_id)
        if job_id in self._jobs:  # started concurrently meanwhile
            return
        self._jobs[job_id] = JobRun(job_id, spec, policy, policy_store, list(dataset),
                                    last_step=last_step)
        logger.info(
            "[job] scheduling job_id=%s policy=%s buckets=%s step=%d",
            job_id,
            spec.layout.policy,
            [b.name for b in spec.layout.buckets],
            last_step,
        )

    async def stop_job(self, job_id: str) -> None:
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
            for run in list(self._jobs.values()):
                try:
                    await self._tick(run)
                except Exception:
                    logger.exception("[loop] tick failed job_id=%s", run.job_id)
            await asyncio.sleep(self._tick_s)

    async def drain(self, _grace_s: float) -> None:
        self._stopping = True

    async def _tick(self, run: JobRun) -> None:
        state, step, published = await self._store.job_status(run.job_id)
        if state is None or state in ("succeeded", "failed", "cancelled"):
            await run.policy_store.flush()
            await self.stop_job(run.job_id)
            return
        # 1) A training step ended: rebuild / snapshot the policy's model.
        self._observe_steps(run, step)
        # 2) Trajectories on instances whose lease expired go back to the queue.
        await self._requeue_orphans(run)
        # 3) Place what is queued (re-queued first, then by policy priority).
        await self._place_pending(run)
        # 4) Admit and place groups while the staleness budget allows and the instances
        #    take them (weights must exist first).
        if run.num_pending == 0 and published:
            await self._admit(run)
        # 5) Persist what the policy changed during this tick.
        await run.policy_store.flush()

    def _observe_steps(self, run: JobRun, step: int) -> None:
        while run.last_step < step:
            run.last_step += 1
            run.policy.on_step_end(run.last_step)
            logger.debug("[step] on_step_end job_id=%s step=%d", run.job_id, run.last_step)

    async def _admit(self, run: JobRun) -> None:
        algo = run.spec.algorithm
        budget_groups = (algo.max_staleness + 1) * algo.prompts_per_step
        counters = await self._store.counters(run.job_id)
        consumed = counters.get("trained_groups", 0) + counters.get("dropped_groups", 0)
        admitted = counters.get("admitted_groups", 0)
        # Stop once a group does not fit: queue at most one group beyond capacity.
        while admitted - consumed < budget_groups and run.num_pending == 0:
            await self._store.admit(run.job_id, self._make_group(run, admitted))
            admitted += 1
            await self._place_pending(run)

    def _make_group(self, run: JobRun, group_index: int) -> list[t.Trajectory]:
        # The group index is the cumulative admission count, so prompts continue where a
        # previous scheduler process stopped.
        run.next_group = max(run.next_group, group_index)
        problem = self._next_problem(run)
        gid = group_id(run.job_id, group_index, problem.prompt_id)
        now_ms = self._clock.now_ms()
        return [t.Trajectory(
            trajectory_id=trajectory_id(gid, sample), job_id=t.JobId(run.job_id),
            group_id=gid, prompt_id=problem.prompt_id, prompt_text=problem.prompt,
            reference=str(problem.answer), created_at_ms=now_ms)
            for sample in range(run.spec.algorithm.samples_per_prompt)]

    def _next_problem(self, run: JobRun) -> Problem:
        # Epoch-wise shuffle so every prompt recurs (the prefix tree learns per prompt).
        if run.next_group >= len(run.order):
            epoch = len(run.order) // max(len(run.problems), 1)
            run.order.extend(
                random.Random(run.spec.task.seed * 1000 + epoch).sample(
                    range(len(run.problems)), len(run.problems)
                )
            )
        index = run.order[run.next_group]
        run.next_group += 1
        return run.problems[index]

    async def _place_pending(self, run: JobRun) -> None:
        pending = await self._store.pending(run.job_id)
        run.num_pending = len(pending)
        if not pending:
            return
        instances = await self._refresh_instances(run)
        pending.sort(key=lambda tr: (-run.policy.priority(tr.trajectory_id), tr.attempt == 0))
        for traj in pending:
            placement = run.policy.begin(TrajectoryDescriptor(
                traj.trajectory_id, traj.prompt_id, traj.group_id, len(traj.prompt_text)),
                instances)
            if not placement.is_placed:
                continue
            traj.instance_id = placement.instance_id
            traj.bucket = placement.bucket or ""
            await self._store.place(run.job_id, traj, placement.instance_id)
            run.num_pending -= 1
            _bump_local_load(instances, placement.instance_id)

    async def _refresh_instances(self, run: JobRun) -> list[t.InstanceLoad]:
        run.instances = await self._store.live_instances(run.job_id)
        run.instances_at_s = self._clock.now_s()
        return run.instances

    async def _requeue_orphans(self, run: JobRun) -> None:
        live = {inst.instance_id for inst in await self._refresh_instances(run)}
        # Scanning every assignment is the costly part of a tick: do it when the set of
        # live instances changed, and otherwise only every ORPHAN_SCAN_S as a safety net.
        now_s = self._clock.now_s()
        if live == run.last_live and now_s - run.last_orphan_scan_s < ORPHAN_SCAN_S:
            return
        run.last_live, run.last_orphan_scan_s = live, now_s
        orphaned: dict[str, list[str]] = {}
        for traj_id, instance_id in (await self._store.assignments(run.job_id)).items():
            if instance_id not in live:
                orphaned.setdefault(instance_id, []).append(traj_id)
        for instance_id, traj_ids in orphaned.items():
            await self._store.forget_instance(run.job_id, instance_id)
            for traj_id in traj_ids:
                await self._requeue(run, traj_id)
            logger.warning(
                "[requeue] instance lost its lease instance_id=%s trajectories=%d",
                instance_id,
                len(traj_ids),
            )

    async def _requeue(self, run: JobRun, traj_id: str) -> None:
        traj = await self._store.task(run.job_id, traj_id)
        try:
            run.policy.abort(t.TrajectoryId(traj_id))
        except UnknownTrajectory:
            pass
        if traj is None:
            await self._store.finish(run.job_id, traj_id)
            return
        traj.attempt += 1
        await self._store.requeue(run.job_id, traj)

    # -- RPCs from rollout instances -----------------------------------------------------

    async def report_tool_return(
        self, job_id: str, traj_id: str, state: t.ToolReturnState, tokens_so_far: int
    ) -> t.PlacementDecision:
        run = self._run(job_id)
        if self._clock.now_s() - run.instances_at_s > 4 * self._tick_s:
            await self._refresh_instances(run)  # the loop is behind: read fresh loads
        instances = run.instances
        try:
            decision = run.policy.on_tool_return(
                t.TrajectoryId(traj_id), state, tokens_so_far, instances
            )
        except UnknownTrajectory:
            run.decisions["unknown"] += 1
            return t.PlacementDecision(t.DecisionAction.STAY, reason="unknown_trajectory")
        run.decisions[decision.reason.value] += 1
        if not decision.is_move:
            return t.PlacementDecision(
                t.DecisionAction.STAY,
                decision.to_bucket,
                decision.to_instance_id,
                decision.reason.value,
            )
        await self._store.move(job_id, traj_id, decision.to_instance_id, decision.to_bucket,
                               decision.load_deltas)
        _apply_local_load(instances, decision.load_deltas)
        run.migrations += 1
        return t.PlacementDecision(
            t.DecisionAction.MOVE,
            decision.to_bucket,
            decision.to_instance_id,
            decision.reason.value,
        )

    async def report_finished(
        self, job_id: str, traj_id: str, total_tokens: int, status: t.TrajectoryStatus
    ) -> None:
        # The slot goes back by assignment (moves keep it current), in one round trip;
        # the policy learns in memory and its store is flushed with the next tick.
        instance_id = await self._store.release(job_id, traj_id)
        run = self._jobs.get(job_id)
        if run is None or instance_id is None:
            return  # not scheduled here, or re-queued meanwhile (its slot is given back)
        try:
            if status is t.TrajectoryStatus.FINISHED:
                run.policy.finish(t.TrajectoryId(traj_id), total_tokens)
            else:
                run.policy.abort(t.TrajectoryId(traj_id))
        except UnknownTrajectory:
            pass  # placed by a previous scheduler process whose policy state was lost
        _apply_local_load(run.instances, ((instance_id, -1),))

    async def stats(self, job_id: str) -> dict[str, Any]:
        run = self._run(job_id)
        return {
            "policy": run.spec.layout.policy,
            "pending": run.num_pending,
            "decisions": dict(run.decisions),
            "migrations": run.migrations,
            "counters": await self._store.counters(job_id),
            "policy_stats": run.policy.stats(),
        }


def _apply_local_load(instances: list[t.InstanceLoad],
                      deltas: tuple[tuple[str, int], ...]) -> None:
    for instance_id, delta in deltas:
        for inst in instances:
            if inst.instance_id == instance_id:
                inst.active_trajectories += delta


def _bump_local_load(instances: list[t.InstanceLoad], instance_id: str) -> None:
    # Keep the snapshot honest within one pass so caps hold without re-reading Redis.
    for inst in instances:
        if inst.instance_id == instance_id:
            inst.active_trajectories += 1
