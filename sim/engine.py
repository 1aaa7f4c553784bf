"""The discrete-event loop: trajectories, tools, the RL step loop, planner moves.

Events (a heap of ``(time, seq, kind, payload)``):

- ``WAKE``: an instance's segment ended (stale if its version moved on);
- ``TOOL``: a tool call returned; the policy decides stay/move, the next turn is sent;
- ``TRAIN_DONE``: a training step ended; weights sync to rollout; the planner runs;
- ``RETRY``: re-try queued admissions (scout time-outs);
- ``NODE_UP``: a re-created rollout node finished loading weights;
- ``JOIN_ACTIVE``: a hybrid node lent to training is ready to contribute;
- ``SYNC_DONE``: a drained weight sync ended (dispatch and training resume).

The placement policy is the project's (``make_policy``); the loop only applies its
load deltas, as the scheduler service does with ``HINCRBY``. Elsewhere: cluster changes
(``sim.replan``), weight sync and partial rollout (``sim.weight_sync``), the RL step
loop (``sim.rl_loop``), batches (``sim.trainer``), the result (``sim.results``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from typing import Any

from libra import types as lt
from scheduling.planner import GlobalResourcePlanner, Plan
from scheduling.policy import BucketLayout, TrajectoryDescriptor, make_policy
from scheduling.policy.base import Reason
from scheduling.policy.thresholds import idle_while_queued
from sim import moves, replan, rl_loop, weight_sync
from sim.instance import Instance, Seq, SimInfeasible
from sim.nodes import NodeRegistry
from sim.pool import HybridPool
from sim.presets import ClusterSpec
from sim.results import simulator_result
from sim.state import SimClock, TrajState
from sim.systems import SystemConfig
from sim.trace import TraceTrajectory
from sim.trainer import BatchSource, SimTrainer

WAKE, TOOL, TRAIN_DONE, RETRY, NODE_UP, JOIN_ACTIVE, SYNC_DONE = range(7)
STATUS = {
    "success": lt.ToolStatus.SUCCESS,
    "failure": lt.ToolStatus.FAILURE,
    "timeout": lt.ToolStatus.TIMEOUT,
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
        train_token_scale: ``SimTrainer``'s ``token_scale`` (1 outside the twin's slice).
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        trace: list[TraceTrajectory],
        system: SystemConfig,
        initial_plan: Plan,
        planner: GlobalResourcePlanner | None = None,
        twin: Any = None,
        train_token_scale: float = 1.0,
    ) -> None:
        self.cluster, self.system, self.planner = cluster, system, planner
        self.train_token_scale = train_token_scale
        self.twin = twin
        self.hw, self.model = cluster.hardware, cluster.model
        self.clock = SimClock()
        self.layout = BucketLayout(system.buckets(self.hw, self.model))
        self.policy = make_policy(
            system.policy, self.layout, system.policy_config, clock=self.clock
        )
        self.sizes = lt.SizeThresholds(*system.size_thresholds)
        self.trajs = [TrajState(rec, i) for i, rec in enumerate(trace)]
        self.steps = sorted({t.rec.step for t in self.trajs})
        self.by_step: dict[int, list[TrajState]] = {s: [] for s in self.steps}
        for t in self.trajs:
            self.by_step[t.rec.step].append(t)
        # Trajectories in steps[0..j] (bounded consumption releases on consumed work).
        self.cum_sizes = list(itertools.accumulate(len(self.by_step[s]) for s in self.steps))
        self._init_state(initial_plan)

    def _init_state(self, plan: Plan) -> None:
        self.events: list[tuple] = []
        self.seq = 0
        self.nodes = NodeRegistry(
            self.hw, self.model, self.system.bucket_for_tp, self.layout
        )
        # The registry's containers, shared (the loop reads them on every event).
        self.instances, self.loads = self.nodes.instances, self.nodes.loads
        self.load_list, self.node_patterns = self.nodes.load_list, self.nodes.node_patterns
        self.plan = plan
        self.train_nodes = plan.train_gpus // self.cluster.gpus_per_node
        self.pending: list[tuple[int, int, TrajState]] = []
        self.trainer = SimTrainer(
            self.hw, self.model, self.cluster.num_gpus, self.cluster.gpus_per_node,
            colocated=self.system.mode == "sync", token_scale=self.train_token_scale,
        )
        self.released_steps = 0
        self.twin_fed_steps = 0
        """Release steps handed to the planner's twin (``sim.replan.feed_twin``)."""
        self.batches = BatchSource(
            self.system.consumption, self.by_step, self.system.consume_unit
        )
        self.step_complete_s: dict[int, float] = {}
        self.consumed: dict[int, list[TrajState]] = {}
        self.batch_span_s: dict[int, float | None] = {}
        self.release_s: dict[int, float] = {}
        self.migrations = self.rejected = self.planner_moves = 0
        self.transition: moves.Transition | None = None
        """The plan change under way (``sim.moves``), if any."""
        self.move_log: list[dict[str, Any]] = []
        """One record per finished move (``sim.moves.Transition.record``)."""
        self._last_retry = -math.inf
        self.idle_while_queued: Counter[str] = Counter()
        self.plan_events: list[dict[str, Any]] = []
        self.pool = HybridPool(
            teardown=lambda node, now: moves.lend_node(self, node, now),
            bring_up=lambda node, pattern, now: replan.bring_up(self, node, pattern, now),
            join_at=lambda when, node: self._push(when, JOIN_ACTIVE, node),
            fetch_s=self.model.num_params * self.model.dtype_bytes / 8
            / self.hw.inter_node_bw_bytes_per_s,
            reserve_nodes=-(
                -self.system.planner_config.elastic_reserve_gpus // self.cluster.gpus_per_node
            ),
            node_patterns=self.node_patterns,
        )
        # Weight sync (sim/weight_sync.py): the trainer step whose weights the rollout
        # serves; a drained sync under way (no dispatch, no training), its start, total.
        self.sync_pause_s, self.weights_version = 0.0, 0
        self.draining, self.drain_started_s, self.drain_s = False, -1.0, 0.0
        # Oldest-token versions of started, unfinished trajectories (bounded consumption).
        self.in_flight_versions: Counter[int] = Counter()
        self.partial_rollouts = 0
        self.finished = 0
        self.last_done_s = 0.0
        for node, pattern in enumerate(plan.rollout_nodes):
            self.nodes.build(self.train_nodes + node, pattern, True, 0.0)

    # Nodes and instances.

    def teardown_node(self, node: int, now: float) -> list[TrajState]:
        """Remove a node's instances; hand their trajectories back (abort + re-queue).
        A turn in progress restarts elsewhere, from the tokens it kept if any
        (``TrajState.partial_tokens``, the ``migrate`` move: ``sim.moves``)."""
        handed = [t for iid in self.nodes.teardown(node, now) for t in self.trajs_on(iid)]
        for t in handed:
            # The turn in progress restarts elsewhere (no KV transfer is modelled); one
            # waiting on its tool is re-queued when the tool returns.
            self.policy.abort(lt.TrajectoryId(t.rec.trajectory_id))
            t.placed, t.instance, t.needs_full_prefill = False, "", True
            if not t.in_tool:
                self.enqueue(t)
        return handed

    def unpin(self, t: TrajState) -> None:
        """Release ``t`` from its instance (a draining one) so its next turn is placed
        anew, with a full prefill; one waiting on its tool is re-queued on its return."""
        self._apply(self.policy.abort(lt.TrajectoryId(t.rec.trajectory_id)).load_deltas)
        t.placed, t.instance, t.needs_full_prefill = False, "", True

    def trajs_on(self, iid: str) -> list[TrajState]:
        return [t for t in self.trajs if t.placed and t.instance == iid and t.finished_s < 0]

    # Event plumbing.

    def _push(self, when: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, payload))

    def _apply(self, deltas: tuple) -> None:
        for iid, delta in deltas:
            self.nodes.add_load(iid, delta)

    # Admission.

    def enqueue(self, t: TrajState) -> None:
        """Queue ``t`` for admission (earlier steps first, then trace order)."""
        heapq.heappush(self.pending, (t.rec.step, t.index, t))

    def admit_pending(self, now: float) -> None:
        if self.draining:
            return  # the reference pauses its dispatcher until the sync is done
        kept: list[tuple[int, int, TrajState]] = []
        # Nodes change only in event handlers (planner, pool, NODE_UP), never within a
        # pass, so one index serves it (a scout policy re-offers every queued one).
        loads = self.nodes.index()
        while self.pending:
            item = heapq.heappop(self.pending)
            t = item[2]
            desc = TrajectoryDescriptor(
                lt.TrajectoryId(t.rec.trajectory_id),
                lt.PromptId(t.rec.prompt_id),
                lt.GroupId(t.rec.group_id),
                t.ctx,
            )
            placement = self.policy.begin(desc, loads)
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
            for iid in idle_while_queued(self.nodes.index(), len(self.pending)):
                self.idle_while_queued[iid] += 1

    def _submit_turn(self, t: TrajState, now: float) -> None:
        turn = t.rec.turns[t.turn]
        if t.needs_full_prefill:
            prefill = t.ctx + t.partial_tokens  # a migrated turn's kept tokens too
        else:
            prev = t.rec.turns[t.turn - 1].tool
            prefill = max(1, prev.payload_tokens if prev else 1)
        t.needs_full_prefill = False
        if t.first_version < 0:
            t.first_version = self.weights_version
            self.in_flight_versions[t.first_version] += 1
        t.last_version = self.weights_version
        seq = Seq(
            t, prefill, turn.output_tokens - t.partial_tokens, t.ctx + t.partial_tokens - prefill,
            t.ctx + turn.output_tokens,
        )
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
            self.finish_steps(inst, inst.steps_done_by(now), now)
            advanced = True
        before = len(inst.running)
        inst.admit_waiting()
        if advanced or len(inst.running) != before or inst.seg_steps == 0:
            self.replan_segment(inst, now)

    def replan_segment(self, inst: Instance, now: float) -> None:
        """Plan the instance's next segment and wake at its end."""
        end = inst.plan_segment(now)
        if end is not None:
            self._push(end, WAKE, (inst.iid, inst.version))

    def finish_steps(self, inst: Instance, k: int, now: float) -> None:
        for seq in inst.advance(k):
            self._turn_done(seq.traj, inst.seg_start)

    # Trajectory events.

    def _turn_done(self, t: TrajState, now: float) -> None:
        turn = t.rec.turns[t.turn]
        t.post_tokens += turn.output_tokens
        t.partial_tokens = 0
        iid = t.instance
        if turn.tool is None:
            self._finish_traj(t, now)
        else:
            t.in_tool = True
            self._push(now + turn.tool.latency_s, TOOL, t)
            if self.transition is not None and self.transition.is_draining(iid):
                self.unpin(t)  # its next turn is placed on a serving instance
        if self.transition is not None:
            self.transition.note(iid)

    def _on_tool(self, t: TrajState, now: float) -> None:
        tool = t.rec.turns[t.turn].tool
        t.post_tokens += tool.payload_tokens
        t.turn += 1
        t.in_tool = False
        if not t.placed:  # handed back while the tool ran
            self.enqueue(t)
            self.admit_pending(now)
            return
        state = lt.ToolReturnState(
            tool.type, self.sizes.classify(tool.payload_tokens), STATUS[tool.status]
        )
        decision = self.policy.on_tool_return(
            lt.TrajectoryId(t.rec.trajectory_id), state, t.post_tokens, self.nodes.index()
        )
        if decision.is_move:
            self._apply(decision.load_deltas)
            self.migrations += 1
            t.instance = decision.to_instance_id
            t.needs_full_prefill = True
        self._submit_turn(t, now)

    def _finish_traj(self, t: TrajState, now: float) -> None:
        release = self.policy.finish(lt.TrajectoryId(t.rec.trajectory_id), t.post_tokens)
        self._apply(release.load_deltas)
        t.placed, t.finished_s = False, now
        self.in_flight_versions[t.first_version] -= 1
        if not self.in_flight_versions[t.first_version]:
            del self.in_flight_versions[t.first_version]
        self.finished += 1
        self.last_done_s = now
        complete = self.batches.on_finish(t)
        if complete:
            self.step_complete_s[t.rec.step] = now
        if complete or self.system.consumption != "barrier":
            rl_loop.maybe_train(self, now)
        self.admit_pending(now)
        if self.draining:
            weight_sync.maybe_drained(self, now)

    # RL loop (sim/rl_loop.py).

    @property
    def version(self) -> int:
        """Steps trained."""
        return self.trainer.version

    def train_done_at(self, when: float, step: int) -> None:
        """Training step ``step`` ends at ``when``."""
        self._push(when, TRAIN_DONE, step)

    def sync_done_at(self, when: float) -> None:
        """A drained sync's transfer ends at ``when``."""
        self._push(when, SYNC_DONE, None)

    # Planner and elastic pool (sim/replan.py).

    def node_up_at(self, when: float, node: int, build: int) -> None:
        """Node ``node`` (its ``build``-th build) serves from ``when`` (weights loaded)."""
        self._push(when, NODE_UP, (node, build))

    def _on_node_up(self, payload: tuple[int, int], now: float) -> None:
        node, build = payload
        if self.nodes.builds.get(node) != build or node not in self.nodes.node_patterns:
            return  # re-created or torn down while it loaded
        self.nodes.mark_up(node)
        if self.transition is not None:
            self.transition.on_node_up(node, now)
        self.admit_pending(now)

    # Main loop.

    def run(self, stop_after_steps: int | None = None) -> dict[str, Any]:
        """Run to the end of the trace (or until ``stop_after_steps`` training steps have
        ended: the twin measures a window and need not simulate the rest); return raw
        counters for ``metrics.summarise``."""
        rl_loop.release_allowed(self, 0.0)
        if self.run_until(math.inf, stop_after_steps):
            return simulator_result(self)
        if self.batches.consumed < len(self.trajs):
            raise SimInfeasible(
                f"simulation stalled after {self.version} of {len(self.steps)} steps "
                f"({self.finished} trajectories finished, {len(self.pending)} queued)"
            )
        return simulator_result(self)

    def run_until(self, until_s: float, stop_after_steps: int | None = None) -> bool:
        """Process every event due at or before ``until_s`` (``run`` releases the first
        steps first; a test may release them, stop mid-run and act on the cluster).
        True when it stopped because ``stop_after_steps`` training steps had ended."""
        handlers = {
            TOOL: self._on_tool,
            TRAIN_DONE: lambda step, now: rl_loop.on_train_done(self, step, now),
            NODE_UP: self._on_node_up,
            RETRY: lambda _p, now: self.admit_pending(now),
            JOIN_ACTIVE: lambda node, _now: self.pool.on_join_active(node),
            SYNC_DONE: lambda _p, now: rl_loop.on_sync_done(self, now),
        }
        scout_timeout = getattr(self.system.policy_config, "scout_timeout_s", None)
        while self.events and self.events[0][0] <= until_s:
            now, _, kind, payload = heapq.heappop(self.events)
            self.clock.t = now
            if kind == WAKE:
                iid, version = payload
                inst = self.instances.get(iid)
                if inst is None or inst.version != version:
                    continue
                self.finish_steps(inst, inst.seg_steps, now)
                inst.admit_waiting()
                self.replan_segment(inst, now)
            else:
                handlers[kind](payload, now)
                if stop_after_steps is not None and self.version >= stop_after_steps:
                    return True
            if self.transition is not None:
                # Between events, never within one: a drained node is replaced here.
                self.transition.settle(now)
            if scout_timeout and self.pending and now - self._last_retry > scout_timeout / 2:
                self._last_retry = now
                self._push(now + scout_timeout + 1e-3, RETRY, None)
        return False
