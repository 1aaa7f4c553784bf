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
from dataclasses import dataclass
from typing import Any

from libra.types import (
    GroupId,
    InstanceId,
    InstanceLoad,
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
    RequestStats,
    StepMetrics,
    TrainParallelism,
    train_step_s,
)
from scheduling.policy import BucketLayout, TrajectoryDescriptor, make_policy
from scheduling.policy.base import Reason
from scheduling.policy.thresholds import idle_while_queued
from sim.instance import Instance, Seq, SimInfeasible
from sim.presets import WEIGHT_LOAD_BW_BYTES_PER_S, ClusterSpec
from sim.systems import SystemConfig
from sim.trace import TraceTrajectory

WAKE, TOOL, TRAIN_DONE, RETRY, NODE_UP, JOIN_ACTIVE = range(6)
STATUS = {
    "success": ToolStatus.SUCCESS,
    "failure": ToolStatus.FAILURE,
    "timeout": ToolStatus.TIMEOUT,
}


class SimClock:
    """Simulated time for policies that read a clock (``la_mlfq`` scouts)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now_s(self) -> float:
        return self.t

    def now_ms(self) -> int:
        return int(self.t * 1000)


@dataclass(slots=True)
class TrajState:
    """Runtime state of one trace trajectory."""

    rec: TraceTrajectory
    index: int
    turn: int = 0
    post_tokens: int = 0
    instance: str = ""
    released_s: float = -1.0
    finished_s: float = -1.0
    placed: bool = False
    needs_full_prefill: bool = True
    in_tool: bool = False

    @property
    def ctx(self) -> int:
        return self.rec.prompt_tokens + self.post_tokens


class Simulator:
    """One run of one system on one cluster and trace.

    Args:
        cluster: Devices and model.
        trace: The workload (steps taken from ``trace[i].step``).
        system: Which policy, layout, RL mode and planner to use.
        initial_plan: Split and layout at time 0.
        planner: Planner (only for systems with online replanning / elastic pool).
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        trace: list[TraceTrajectory],
        system: SystemConfig,
        initial_plan: Plan,
        planner: GlobalResourcePlanner | None = None,
    ) -> None:
        self.cluster, self.system, self.planner = cluster, system, planner
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
        self.instances: dict[str, Instance] = {}
        self.loads: dict[str, InstanceLoad] = {}
        self.load_list: list[InstanceLoad] = []
        self.plan = plan
        self.node_patterns: dict[int, tuple[int, ...]] = {}
        self.train_nodes = plan.train_gpus // self.cluster.gpus_per_node
        self.pending: list[tuple[int, int, TrajState]] = []
        self.version = 0
        self.released_steps = 0
        self.step_done_count: Counter[int] = Counter()
        self.step_complete_s: dict[int, float] = {}
        self.trainer_busy = False
        self.train_busy_gpu_s = 0.0
        self.train_log: list[dict[str, Any]] = []
        self.migrations = 0
        self.rejected = 0
        self.idle_while_queued: Counter[str] = Counter()
        self.created_s: dict[str, float] = {}
        # Per bucket: [busy GPU-s, held GPU-s] of instances already torn down.
        self.retired_by_bucket: dict[str, list[float]] = {}
        self.planner_moves = 0
        self.plan_events: list[dict[str, Any]] = []
        self.hybrid_nodes: list[int] = []
        self.hybrid_patterns: dict[int, tuple[int, ...]] = {}
        self.retired_busy_gpu_s = 0.0
        self.hybrid_active: set[int] = set()
        self.sync_pause_s = 0.0
        self.finished = 0
        self.last_done_s = 0.0
        self.last_complete_s = 0.0
        for node, pattern in enumerate(plan.rollout_nodes):
            self._build_node(self.train_nodes + node, pattern, alive=True, now=0.0)

    # Nodes and instances.

    def _build_node(self, node: int, pattern: tuple[int, ...], alive: bool, now: float) -> None:
        self.node_patterns[node] = pattern
        for j, tp in enumerate(pattern):
            iid = f"n{node:04d}-i{j}-tp{tp}"
            bucket = self.system.bucket_for_tp(tp)
            inst = Instance.create(iid, tp, bucket, node, self.hw, self.model)
            inst.alive = alive
            self.instances[iid] = inst
            self.created_s[iid] = now
            load = InstanceLoad(InstanceId(iid), bucket, 0, is_live=alive)
            self.loads[iid] = load
            self.load_list.append(load)

    def _teardown_node(self, node: int, now: float) -> list[TrajState]:
        """Remove a node's instances; hand their trajectories back (abort + re-queue)."""
        handed: list[TrajState] = []
        for iid in [i for i, inst in self.instances.items() if inst.node == node]:
            inst = self.instances.pop(iid)
            self.retired_busy_gpu_s += inst.busy_s * inst.tp
            pair = self.retired_by_bucket.setdefault(inst.bucket, [0.0, 0.0])
            pair[0] += inst.busy_s * inst.tp
            pair[1] += (now - self.created_s.pop(iid)) * inst.tp
            self.load_list.remove(self.loads.pop(iid))
            for t in self.trajs_on(iid):
                handed.append(t)
            inst.evict_all()
        self.node_patterns.pop(node, None)
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
        self.step_done_count[t.rec.step] += 1
        if self.step_done_count[t.rec.step] == len(self.by_step[t.rec.step]):
            self.step_complete_s[t.rec.step] = now
            self._maybe_train(now)
        self._admit_pending(now)

    # RL loop.

    def _maybe_train(self, now: float) -> None:
        trained = self.version
        if self.trainer_busy or trained >= len(self.steps):
            return
        step = self.steps[trained]
        if step not in self.step_complete_s:
            return
        self.trainer_busy = True
        tokens = sum(t.rec.total_tokens for t in self.by_step[step])
        mean_seq = tokens / len(self.by_step[step])
        gpus, par = self._train_group()
        train_s = train_step_s(self.hw, self.model, par, tokens, mean_seq)
        self.train_busy_gpu_s += train_s * gpus
        rollout_s = now - self.last_complete_s
        self.last_complete_s = now
        self.train_log.append(
            {
                "step": step,
                "start_s": now,
                "train_s": train_s,
                "rollout_s": rollout_s,
                "train_gpus": gpus,
            }
        )
        self._push(now + train_s, TRAIN_DONE, step)

    def _train_group(self) -> tuple[int, TrainParallelism]:
        if self.system.mode == "sync":
            par = TrainParallelism(8, 1, self.cluster.num_gpus // 8)
            return par.num_gpus, par
        base = self.plan.train
        extra = len(self.hybrid_active) * self.cluster.gpus_per_node // (base.tp * base.pp)
        par = TrainParallelism(base.tp, base.pp, base.dp + extra, base.micro_batch)
        return par.num_gpus, par

    def _on_train_done(self, step: int, now: float) -> None:
        self.trainer_busy = False
        self.version += 1
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
        log = self.train_log[-1]
        reqs = tuple(
            RequestStats(t.rec.prompt_tokens, t.rec.post_prompt_tokens, t.rec.tool_s)
            for t in self.by_step[step]
        )
        cap = (
            sum(
                self.layout.get(inst.bucket).max_trajectories_per_instance
                for inst in self.instances.values()
                if inst.alive
            )
            or 1
        )
        pinned = sum(load.active_trajectories for load in self.load_list)
        metrics = StepMetrics(
            step=self.version,
            rollout_s=log["rollout_s"],
            train_s=log["train_s"],
            queue_pressure=len(self.pending) / cap,
            active_pressure=pinned / cap,
            rejected_total=self.rejected,
            hybrid_active=len(self.hybrid_active),
            hybrid_joining=len(self.hybrid_nodes) - len(self.hybrid_active),
            requests=reqs,
            requests_per_step=len(reqs),
        )
        self.planner.observe(metrics)
        event = self.planner.decide(self.version)
        self.plan_events.append(event.to_dict())
        if event.applied and self.system.enable_replan:
            self._apply_plan(self.planner.current, now)
        if event.elastic is not None and self.system.enable_elastic:
            self._apply_elastic(event.elastic.desired_replicas, now)

    def _apply_plan(self, plan: Plan, now: float) -> None:
        """Re-create rollout nodes whose pattern changed; training nodes change at the next step."""
        self.planner_moves += 1
        old_train = self.train_nodes
        new_train = plan.train_gpus // self.cluster.gpus_per_node
        self._release_hybrids(now)
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
        for inst in self.instances.values():
            if inst.node == node:
                inst.alive = True
                self.loads[inst.iid].is_live = True
        self._admit_pending(now)

    def _apply_elastic(self, desired: int, now: float) -> None:
        current = len(self.hybrid_nodes)
        rollout_nodes = sorted(self.node_patterns)
        reserve = -(-self.planner_config().elastic_reserve_gpus // self.cluster.gpus_per_node)
        while desired > current and len(rollout_nodes) > reserve:
            node = rollout_nodes.pop()
            self.hybrid_patterns[node] = self.node_patterns[node]
            self._teardown_node(node, now)
            self.hybrid_nodes.append(node)
            fetch = (
                self.model.num_params
                * self.model.dtype_bytes
                / 8
                / self.hw.inter_node_bw_bytes_per_s
            )
            self._push(now + fetch, JOIN_ACTIVE, node)
            self.planner_moves += 1
            current += 1
        while desired < current:
            self._release_one(self.hybrid_nodes[-1], now)
            current -= 1
        self._admit_pending(now)

    def _release_hybrids(self, now: float) -> None:
        for node in list(self.hybrid_nodes):
            self._release_one(node, now)

    def _release_one(self, node: int, now: float) -> None:
        self.hybrid_nodes.remove(node)
        self.hybrid_active.discard(node)
        self.planner_moves += 1
        self._bring_up(node, self.hybrid_patterns.pop(node), now)

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
            JOIN_ACTIVE: lambda node, now: (
                self.hybrid_active.add(node) if node in self.hybrid_nodes else None
            ),
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
        return self._raw()

    def _raw(self) -> dict[str, Any]:
        end = (
            self.train_log[-1]["start_s"] + self.train_log[-1]["train_s"] if self.train_log else 0.0
        )
        rollout_gpu_s = sum(inst.busy_s * inst.tp for inst in self.instances.values())
        # Busy over held GPU-seconds per bucket, torn-down instances included.
        bucket_busy = {b: list(pair) for b, pair in self.retired_by_bucket.items()}
        for iid, inst in self.instances.items():
            pair = bucket_busy.setdefault(inst.bucket, [0.0, 0.0])
            pair[0] += inst.busy_s * inst.tp
            pair[1] += max(0.0, end - self.created_s[iid]) * inst.tp
        return {
            "bucket_busy_fraction": {
                b: busy / held if held else 0.0 for b, (busy, held) in sorted(bucket_busy.items())
            },
            "idle_while_queued": dict(self.idle_while_queued),
            "makespan_s": end,
            "rollout_busy_gpu_s": rollout_gpu_s + self.retired_busy_gpu_s,
            "train_busy_gpu_s": self.train_busy_gpu_s,
            "migrations": self.migrations,
            "planner_moves": self.planner_moves,
            "rejected": self.rejected,
            "latencies_s": [t.finished_s - t.released_s for t in self.trajs],
            "train_log": self.train_log,
            "plan_events": self.plan_events,
            "max_kv_fraction": max(
                (i.max_kv_reserved / max(1, i.kv_capacity) for i in self.instances.values()),
                default=0.0,
            ),
            "policy_stats": self.policy.stats(),
        }
