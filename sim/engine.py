"""The discrete-event loop: trajectories, tools, the RL step loop, planner moves.

Events (a heap of ``(time, seq, kind, payload)``):

- ``WAKE``: an instance's segment ended (stale if its version moved on);
- ``TOOL``: a tool call returned; the policy decides stay/move, the next turn is sent;
- ``TRAIN_DONE``: a training step ended; weights sync to rollout; the planner runs;
- ``RETRY``: re-try queued admissions (scout time-outs);
- ``NODE_UP``: a re-created rollout node finished loading weights;
- ``JOIN_ACTIVE``: a hybrid node lent to training is ready to contribute.

The placement policy is the project's (``make_policy``); the loop only applies its
load deltas, as the scheduler service does with ``HINCRBY``.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from typing import Any

from libra.types import (
    GroupId,
    PromptId,
    SizeThresholds,
    ToolReturnState,
    ToolStatus,
    TrajectoryId,
)
from scheduling.planner import (
    GlobalResourcePlanner,
    Plan,
    PlannerConfig,
)
from scheduling.policy import BucketLayout, TrajectoryDescriptor, make_policy
from scheduling.policy.base import Reason
from scheduling.policy.thresholds import idle_while_queued
from sim.instance import Instance, Seq, SimInfeasible
from sim.nodes import NodeRegistry
from sim.planner_step import step_metrics
from sim.pool import HybridPool
from sim.presets import WEIGHT_LOAD_BW_BYTES_PER_S, ClusterSpec
from sim.results import raw_result
from sim.state import SimClock, TrajState
from sim.systems import SystemConfig
from sim.trace import TraceTrajectory
from sim.trainer import BatchSource, SimTrainer

WAKE, TOOL, TRAIN_DONE, RETRY, NODE_UP, JOIN_ACTIVE = range(6)
STATUS = {
    "success": ToolStatus.SUCCESS,
    "failure": ToolStatus.FAILURE,
    "timeout": ToolStatus.TIMEOUT,
}


class Simulator:
    """One run of one system on one cluster and trace.

    Args:
        cluster: Devices and model.
        trace: The workload (steps taken from ``trace[i].step``).
        system: Which policy, layout, RL mode and planner to use.
        initial_plan: Split and layout at time 0.
        planner: Planner (only for systems with online replanning / elastic pool).
        twin: The planner's twin (``sim.twin.TwinRefiner``), fed each finished step.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        trace: list[TraceTrajectory],
        system: SystemConfig,
        initial_plan: Plan,
        planner: GlobalResourcePlanner | None = None,
        twin: Any = None,
    ) -> None:
        self.cluster, self.system, self.planner = cluster, system, planner
        self.twin = twin
        self.hw, self.model = cluster.hardware, cluster.model
        self.clock = SimClock()
        self.layout = BucketLayout(system.buckets(self.hw, self.model))
        self.policy = make_policy(
            system.policy, self.layout, system.policy_config, clock=self.clock
        )
        self.sizes = SizeThresholds(*system.size_thresholds)
        self.trajs = [TrajState(rec, i) for i, rec in enumerate(trace)]
        self.steps = sorted({t.rec.step for t in self.trajs})
        self.by_step: dict[int, list[TrajState]] = {s: [] for s in self.steps}
        for t in self.trajs:
            self.by_step[t.rec.step].append(t)
        self._init_state(initial_plan)

    def _init_state(self, plan: Plan) -> None:
        self.events: list[tuple] = []
        self.seq = 0
        self.nodes = NodeRegistry(self.hw, self.model, self.system.bucket_for_tp)
        # The registry's containers, shared (the loop reads them on every event).
        self.instances, self.loads = self.nodes.instances, self.nodes.loads
        self.load_list, self.node_patterns = self.nodes.load_list, self.nodes.node_patterns
        self.plan = plan
        self.train_nodes = plan.train_gpus // self.cluster.gpus_per_node
        self.pending: list[tuple[int, int, TrajState]] = []
        self.trainer = SimTrainer(
            self.hw, self.model, self.cluster.num_gpus, self.cluster.gpus_per_node,
            colocated=self.system.mode == "sync",
        )
        self.released_steps = 0
        self.batches = BatchSource(self.system.consumption, self.by_step)
        self.step_complete_s: dict[int, float] = {}
        self.consumed: dict[int, list[TrajState]] = {}
        self.batch_span_s: dict[int, float] = {}
        self.migrations = 0
        self.rejected = 0
        self.idle_while_queued: Counter[str] = Counter()
        self.planner_moves = 0
        self.plan_events: list[dict[str, Any]] = []
        self.pool = HybridPool(
            teardown=self._teardown_node,
            bring_up=self._bring_up,
            join_at=lambda when, node: self._push(when, JOIN_ACTIVE, node),
            fetch_s=self.model.num_params * self.model.dtype_bytes / 8
            / self.hw.inter_node_bw_bytes_per_s,
            reserve_nodes=-(
                -self.system.planner_config.elastic_reserve_gpus // self.cluster.gpus_per_node
            ),
            node_patterns=self.node_patterns,
        )
        self.sync_pause_s = 0.0
        self.finished = 0
        self.last_done_s = 0.0
        for node, pattern in enumerate(plan.rollout_nodes):
            self._build_node(self.train_nodes + node, pattern, alive=True, now=0.0)

    # Nodes and instances.

    def _build_node(self, node: int, pattern: tuple[int, ...], alive: bool, now: float) -> None:
        self.nodes.build(node, pattern, alive, now)

    def _teardown_node(self, node: int, now: float) -> list[TrajState]:
        """Remove a node's instances; hand their trajectories back (abort + re-queue)."""
        handed = [t for iid in self.nodes.teardown(node, now) for t in self.trajs_on(iid)]
        for t in handed:
            # The turn in progress restarts elsewhere (no KV transfer is modelled); one
            # waiting on its tool is re-queued when the tool returns.
            self.policy.abort(TrajectoryId(t.rec.trajectory_id))
            t.placed, t.instance, t.needs_full_prefill = False, "", True
            if not t.in_tool:
                self._queue(t)
        return handed

    def trajs_on(self, iid: str) -> list[TrajState]:
        return [t for t in self.trajs if t.placed and t.instance == iid and t.finished_s < 0]

    # Event plumbing.

    def _push(self, when: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, payload))

    def _apply(self, deltas: tuple) -> None:
        for iid, delta in deltas:
            self.loads[iid].active_trajectories += delta

    # Admission.

    def _release_step(self, step_index: int, now: float) -> None:
        step = self.steps[step_index]
        self.batches.on_release(step, self.version)
        for t in self.by_step[step]:
            t.released_s = now
            self._queue(t)
        self.released_steps = step_index + 1

    def _queue(self, t: TrajState) -> None:
        heapq.heappush(self.pending, (t.rec.step, t.index, t))

    def _admit_pending(self, now: float) -> None:
        kept: list[tuple[int, int, TrajState]] = []
        while self.pending:
            item = heapq.heappop(self.pending)
            t = item[2]
            desc = TrajectoryDescriptor(
                TrajectoryId(t.rec.trajectory_id),
                PromptId(t.rec.prompt_id),
                GroupId(t.rec.group_id),
                t.ctx,
            )
            placement = self.policy.begin(desc, self.load_list)
            if not placement.is_placed:
                self.rejected += 1
                kept.append(item)
                if placement.reason is Reason.NO_CAPACITY:
                    break
                continue
            self._apply(placement.load_deltas)
            t.placed, t.instance = True, placement.instance_id
            self._submit_turn(t, now)
        for item in kept:
            heapq.heappush(self.pending, item)
        if self.pending:
            # The policy's health check: nothing should idle while work waits for a place.
            for iid in idle_while_queued(self.load_list, len(self.pending)):
                self.idle_while_queued[iid] += 1

    def _submit_turn(self, t: TrajState, now: float) -> None:
        turn = t.rec.turns[t.turn]
        if t.needs_full_prefill:
            prefill = t.ctx
        else:
            prev = t.rec.turns[t.turn - 1].tool
            prefill = max(1, prev.payload_tokens if prev else 1)
        t.needs_full_prefill = False
        seq = Seq(t, prefill, turn.output_tokens, t.ctx - prefill, t.ctx + turn.output_tokens)
        inst = self.instances[t.instance]
        inst.waiting.append(seq)
        self._kick(inst, now)

    def _kick(self, inst: Instance, now: float) -> None:
        """Admit what fits; re-plan the segment if the batch changed."""
        if not inst.alive:
            return
        advanced = False
        if inst.seg_steps and inst.waiting and inst.can_admit(inst.waiting[0]):
            # Interrupt after the step in progress; the new turn joins the next step.
            self._finish_steps(inst, inst.steps_done_by(now), now)
            advanced = True
        before = len(inst.running)
        inst.admit_waiting()
        if advanced or len(inst.running) != before or inst.seg_steps == 0:
            end = inst.plan_segment(now)
            if end is not None:
                self._push(end, WAKE, (inst.iid, inst.version))

    def _finish_steps(self, inst: Instance, k: int, now: float) -> None:
        for seq in inst.advance(k):
            self._turn_done(seq.traj, inst.seg_start)

    # Trajectory events.

    def _turn_done(self, t: TrajState, now: float) -> None:
        turn = t.rec.turns[t.turn]
        t.post_tokens += turn.output_tokens
        if turn.tool is None:
            self._finish_traj(t, now)
            return
        t.in_tool = True
        self._push(now + turn.tool.latency_s, TOOL, t)

    def _on_tool(self, t: TrajState, now: float) -> None:
        tool = t.rec.turns[t.turn].tool
        t.post_tokens += tool.payload_tokens
        t.turn += 1
        t.in_tool = False
        if not t.placed:  # handed back while the tool ran
            self._queue(t)
            self._admit_pending(now)
            return
        state = ToolReturnState(
            tool.type, self.sizes.classify(tool.payload_tokens), STATUS[tool.status]
        )
        decision = self.policy.on_tool_return(
            TrajectoryId(t.rec.trajectory_id), state, t.post_tokens, self.load_list
        )
        if decision.is_move:
            self._apply(decision.load_deltas)
            self.migrations += 1
            t.instance = decision.to_instance_id
            t.needs_full_prefill = True
        self._submit_turn(t, now)

    def _finish_traj(self, t: TrajState, now: float) -> None:
        release = self.policy.finish(TrajectoryId(t.rec.trajectory_id), t.post_tokens)
        self._apply(release.load_deltas)
        t.placed, t.finished_s = False, now
        self.finished += 1
        self.last_done_s = now
        complete = self.batches.on_finish(t)
        if complete:
            self.step_complete_s[t.rec.step] = now
        if complete or self.system.consumption == "stream":
            self._maybe_train(now)
        self._admit_pending(now)

    # RL loop.

    def _maybe_train(self, now: float) -> None:
        trained = self.trainer.version
        if self.trainer.busy or trained >= len(self.steps):
            return
        step = self.steps[trained]
        batch = self.batches.take(step, step in self.step_complete_s, trained)
        if batch is None:
            return
        self.consumed[step] = batch
        # Release to completion: the step's own completion under a barrier, the batch
        # becoming ready when streaming.
        end = self.step_complete_s[step] if self.system.consumption == "barrier" else now
        self.batch_span_s[step] = end - min(t.released_s for t in batch)
        tokens = [t.rec.total_tokens for t in batch]
        train_s = self.trainer.start(step, tokens, self.plan.train, len(self.pool.active), now)
        self._push(now + train_s, TRAIN_DONE, step)

    @property
    def version(self) -> int:
        """Steps trained."""
        return self.trainer.version

    def _on_train_done(self, step: int, now: float) -> None:
        self.trainer.done()
        self._sync_weights(now)
        if self.planner is not None:
            self._run_planner(step, now)
        self._release_allowed(now)
        self._maybe_train(now)

    def _release_allowed(self, now: float) -> None:
        bound = 0 if self.system.mode == "sync" else self.system.staleness
        while self.released_steps < len(self.steps) and self.released_steps <= self.version + bound:
            self._release_step(self.released_steps, now)
        self._admit_pending(now)

    def _sync_weights(self, now: float) -> None:
        """Rollout instances pause while they receive the new weights."""
        if self.system.mode == "sync":
            return  # colocated: the engine reloads in place, folded into the step
        for inst in self.instances.values():
            if not inst.alive:
                continue
            pause = (
                self.model.num_params
                * self.model.dtype_bytes
                / inst.tp
                / self.hw.inter_node_bw_bytes_per_s
            )
            if inst.seg_steps:
                self._finish_steps(inst, inst.steps_done_by(now), now)
            inst.pause_until = max(now, inst.seg_start) + pause
            self.sync_pause_s += pause
            end = inst.plan_segment(now)
            if end is not None:
                self._push(end, WAKE, (inst.iid, inst.version))

    # Planner and elastic pool.

    def _run_planner(self, step: int, now: float) -> None:
        batch = [t.rec for t in self.consumed[step]]
        if self.twin is not None:
            self.twin.observe_step(batch)
        metrics = step_metrics(
            version=self.version,
            log=self.trainer.log[-1],
            trajectories=batch,
            pinned_caps=(
                self.layout.get(inst.bucket).max_trajectories_per_instance
                for inst in self.instances.values()
                if inst.alive
            ),
            loads=self.load_list,
            pending=len(self.pending),
            rejected=self.rejected,
            hybrid_active=len(self.pool.active),
            hybrid_joining=self.pool.joining,
            span_s=self.batch_span_s[step],
        )
        self.planner.observe(metrics)
        event = self.planner.decide(self.version)
        self.plan_events.append(event.to_dict())
        if event.applied and self.system.enable_replan:
            self._apply_plan(self.planner.current, now)
        if event.elastic is not None and self.system.enable_elastic:
            self.pool.resize(event.elastic.desired_replicas, sorted(self.node_patterns), now)
            self._admit_pending(now)

    def _apply_plan(self, plan: Plan, now: float) -> None:
        """Re-create rollout nodes whose pattern changed; training nodes change at the next step."""
        self.planner_moves += 1
        old_train = self.train_nodes
        new_train = plan.train_gpus // self.cluster.gpus_per_node
        self.pool.release_all(now)
        wanted = {new_train + i: p for i, p in enumerate(plan.rollout_nodes)}
        for node in range(min(old_train, new_train), self.cluster.num_nodes):
            if self.node_patterns.get(node) != wanted.get(node):
                if node in self.node_patterns:
                    self._teardown_node(node, now)
                if node in wanted:
                    self._bring_up(node, wanted[node], now)
        self.train_nodes, self.plan = new_train, plan
        self._admit_pending(now)

    def _bring_up(self, node: int, pattern: tuple[int, ...], now: float) -> None:
        self._build_node(node, pattern, alive=False, now=now)
        load_s = (
            self.model.num_params
            * self.model.dtype_bytes
            / min(pattern)
            / WEIGHT_LOAD_BW_BYTES_PER_S
        )
        self._push(now + load_s, NODE_UP, node)

    def _on_node_up(self, node: int, now: float) -> None:
        self.nodes.mark_up(node)
        self._admit_pending(now)

    def planner_config(self) -> PlannerConfig:
        return self.system.planner_config

    # Main loop.

    def run(self) -> dict[str, Any]:
        """Run to the end of the trace; return raw counters for ``metrics.summarise``."""
        self._release_allowed(0.0)
        handlers = {
            TOOL: self._on_tool,
            TRAIN_DONE: self._on_train_done,
            NODE_UP: self._on_node_up,
            RETRY: lambda _p, now: self._admit_pending(now),
            JOIN_ACTIVE: lambda node, _now: self.pool.on_join_active(node),
        }
        scout_timeout = getattr(self.system.policy_config, "scout_timeout_s", None)
        last_retry = -math.inf
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            self.clock.t = now
            if kind == WAKE:
                iid, version = payload
                inst = self.instances.get(iid)
                if inst is None or inst.version != version:
                    continue
                self._finish_steps(inst, inst.seg_steps, now)
                inst.admit_waiting()
                end = inst.plan_segment(now)
                if end is not None:
                    self._push(end, WAKE, (inst.iid, inst.version))
            else:
                handlers[kind](payload, now)
            if scout_timeout and self.pending and now - last_retry > scout_timeout / 2:
                last_retry = now
                self._push(now + scout_timeout + 1e-3, RETRY, None)
        if self.version < len(self.steps):
            raise SimInfeasible(
                f"simulation stalled after {self.version} of {len(self.steps)} steps "
                f"({self.finished} trajectories finished, {len(self.pending)} queued)"
            )
        return raw_result(
            self.instances, self.nodes.created_s, self.nodes.retired_by_bucket, self.trainer.log,
            self.trajs, counters={
                "idle_while_queued": dict(self.idle_while_queued),
                "retired_busy_gpu_s": self.nodes.retired_busy_gpu_s,
                "train_busy_gpu_s": self.trainer.busy_gpu_s,
                "migrations": self.migrations,
                "planner_moves": self.planner_moves + self.pool.moves,
                "consumed_staleness": self.batches.staleness,
                "rejected": self.rejected,
                "plan_events": self.plan_events,
                "policy_stats": self.policy.stats(),
            },
        )
