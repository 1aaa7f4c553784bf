"""Online replanning and the elastic pool inside a simulated run.

After each training step the planner observes the step (``sim.planner_step``), decides,
and the run applies what it chose: a new split and rollout layout (nodes whose
pattern changed are released and re-created, loading weights before they serve, by
the system's reconfigure strategy: ``sim.moves``) and the elastic pool's size. These
functions act on a ``sim.engine.Simulator``; they are kept apart from the event loop
because they change the cluster, not a trajectory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduling.planner import Plan, pipeline_depth
from sim import moves
from sim.moves import NodeOp, Transition
from sim.planner_step import step_metrics
from sim.presets import WEIGHT_LOAD_BW_BYTES_PER_S

if TYPE_CHECKING:
    from sim.engine import Simulator
    from sim.state import TrajState


def run_planner(sim: Simulator, step: int, now: float) -> None:
    """Feed step ``step`` to the planner (and its twin); apply its plan and pool size."""
    batch = [t.rec for t in sim.consumed[step]]
    if sim.twin is not None:
        feed_twin(sim)
    metrics = step_metrics(
        version=sim.version,
        log=sim.trainer.log[-1],
        trajectories=batch,
        pinned_caps=(
            sim.layout.get(inst.bucket).max_trajectories_per_instance
            for inst in sim.instances.values()
            if inst.alive
        ),
        loads=sim.load_list,
        pending=len(sim.pending),
        rejected=sim.rejected,
        hybrid_active=len(sim.pool.active),
        hybrid_joining=sim.pool.joining,
        span_s=sim.batch_span_s[step],
    )
    sim.planner.observe(metrics)
    event = sim.planner.decide(sim.version)
    sim.plan_events.append(event.to_dict())
    if event.applied and sim.system.enable_replan:
        apply_plan(sim, sim.planner.current, now)
    if event.elastic is not None and sim.system.enable_elastic:
        busy = sim.transition.busy_nodes if sim.transition is not None else set()
        lendable = sorted(n for n in sim.node_patterns if n not in busy)
        sim.pool.resize(event.elastic.desired_replicas, lendable, now)
        sim.admit_pending(now)


def feed_twin(sim: Simulator) -> None:
    """Hand the twin each released step whose trajectories have all finished, in step
    order, and the newest released step (the trend's target). Whole release steps, not
    consumed batches: under streaming a batch is the first finishers, the shortest."""
    while sim.twin_fed_steps < sim.released_steps:
        step = sim.steps[sim.twin_fed_steps]
        if any(t.finished_s < 0 for t in sim.by_step[step]):
            break
        sim.twin.observe_step([t.rec for t in sim.by_step[step]])
        sim.twin_fed_steps += 1
    if sim.released_steps:
        sim.twin.observe_release(sim.steps[sim.released_steps - 1])


def apply_plan(sim: Simulator, plan: Plan, now: float, counted: bool = True) -> None:
    """Move to ``plan`` by the system's reconfigure strategy (``sim.moves``): the rollout
    nodes whose pattern changes, those turning to training and those coming from it.
    A plan applied while a move is under way starts once that move ends."""
    if counted:
        sim.planner_moves += 1
    if sim.transition is not None:
        sim.transition.queued_plan = plan
        return
    old_train = sim.train_nodes
    new_train = plan.train_gpus // sim.cluster.gpus_per_node
    sim.pool.release_all(now)
    wanted = {new_train + i: p for i, p in enumerate(plan.rollout_nodes)}
    ops = [
        NodeOp(node, sim.node_patterns.get(node) if node >= old_train else None, wanted.get(node))
        for node in range(min(old_train, new_train), sim.cluster.num_nodes)
        if (sim.node_patterns.get(node) if node >= old_train else None) != wanted.get(node)
    ]
    # Nodes whose devices are free first (they add capacity), nodes leaving for
    # training last (they take it away); the order ``staged`` works through.
    ops.sort(key=lambda op: (op.old is not None, op.new is None, op.node))
    sim.train_nodes = new_train
    transition = Transition(
        sim, plan, ops, moves.strategy(sim.system.reconfigure_strategy),
        sim.system.reconfigure_stage_nodes, now,
    )
    sim.transition = transition
    transition.start(now)
    sim.admit_pending(now)


def bring_up(sim: Simulator, node: int, pattern: tuple[int, ...], now: float) -> None:
    """Create a node's instances, not serving until its weights are loaded (``NODE_UP``)."""
    sim.nodes.build(node, pattern, False, now)
    load_s = (
        sim.model.num_params * sim.model.dtype_bytes / min(pattern) / WEIGHT_LOAD_BW_BYTES_PER_S
    )
    sim.node_up_at(now + load_s, node, sim.nodes.builds[node])


def span_s(sim: Simulator, step: int, batch: list[TrajState], now: float) -> float | None:
    """Release to completion of a step (the elastic trigger's rollout signal).
    Barrier: until the step's own completion; stream: until the batch is ready;
    bounded: from the step's release until a step's worth is ready, once the pipeline
    is full (before, ``None``: the first finishers are the shortest)."""
    mode = sim.system.consumption
    if mode == "barrier":
        return sim.step_complete_s[step] - min(t.released_s for t in batch)
    if mode == "stream":
        return now - min(t.released_s for t in batch)
    if sim.trainer.version < pipeline_depth(sim.system.staleness):
        return None
    return now - sim.release_s[step]
