"""The reconfigure strategies' mechanics on a tiny cluster (issue 20, session 16).

A hand-made trace of long single-turn and two-turn trajectories on 4 x 8 A800 (one
training node, three rollout nodes of TP8); the run is stopped mid-generation, a move is
applied, and the run goes on to the end. Every assertion is on simulated state, which
is deterministic: no wall time is read.
"""

from __future__ import annotations

import math

import pytest

from libra.errors import InvalidArgument
from scheduling.planner import Plan, TrainParallelism
from sim import moves, presets, rl_loop
from sim.engine import Simulator
from sim.replan import apply_plan
from sim.systems import SystemConfig
from sim.trace import ToolCall, TraceTrajectory, Turn

CLUSTER = presets.cluster("a800x32")
TP8 = (8,)
START = Plan(TrainParallelism(8, 1, 1), (TP8, TP8, TP8))
"""Node 0 trains; nodes 1-3 serve one TP8 instance each."""
MOVE_AT_S = 10.0
"""After every first turn has started (prefills take under a second) and well before
the 6,000-token turns end (about 25 s at TP8 with two in the batch)."""


def _trace() -> list[TraceTrajectory]:
    tool = ToolCall("bash", 50, "success", 5.0)
    out = []
    for i in range(6):
        turns = (Turn(6_000, tool), Turn(500)) if i % 2 else (Turn(6_000),)
        out.append(TraceTrajectory(f"t{i}", f"p{i}", f"g{i}", 0, 1_000, turns))
    return out


def _system(strategy: str, stage_nodes: int = 1) -> SystemConfig:
    return SystemConfig(
        name="t", policy="least_loaded", node_patterns=(TP8, (4, 4)),
        consumption="bounded", consume_unit="trajectory",
        reconfigure_strategy=strategy, reconfigure_stage_nodes=stage_nodes,
    )


def _started(strategy: str, stage_nodes: int = 1) -> Simulator:
    sim = Simulator(CLUSTER, _trace(), _system(strategy, stage_nodes), START)
    rl_loop.release_allowed(sim, 0.0)
    sim.run_until(MOVE_AT_S)
    return sim


def _decoding_on(sim: Simulator, node: int) -> list:
    return [
        seq.traj for inst in sim.instances.values() if inst.node == node
        for seq in inst.running.values()
    ]


def _finish(sim: Simulator) -> dict | None:
    sim.run_until(math.inf)
    assert sim.finished == len(sim.trajs)
    for t in sim.trajs:  # every token of every trajectory was generated, once counted
        assert t.post_tokens == t.rec.post_prompt_tokens
        assert t.partial_tokens == 0
    return sim.move_log[-1] if sim.move_log else None


def test_restart_all_restarts_the_turns_of_a_changed_node() -> None:
    sim = _started("restart_all")
    on_node = _decoding_on(sim, 3)
    assert on_node
    apply_plan(sim, Plan(START.train, (TP8, TP8, (4, 4))), MOVE_AT_S)
    # Handed back and placed again elsewhere, from the start of the turn.
    assert all(not t.instance.startswith("n0003") and t.partial_tokens == 0 for t in on_node)
    record = _finish(sim)
    assert record["lost_tokens"] > 0 and record["kept_tokens"] == 0
    assert record["handed_back"] == len(on_node)


def test_migrate_keeps_generated_tokens_and_resumes_from_them() -> None:
    sim = _started("migrate")
    on_node = _decoding_on(sim, 3)
    apply_plan(sim, Plan(START.train, (TP8, TP8, (4, 4))), MOVE_AT_S)
    kept = {t.index: t.partial_tokens for t in on_node}
    assert all(0 < k < 6_000 for k in kept.values())
    record = sim.transition.record  # the move ends once node 3 has loaded its weights
    assert record["kept_tokens"] == sum(kept.values()) and record["lost_tokens"] == 0
    # The resumed turn prefills context + kept tokens and decodes only the rest.
    sim.run_until(MOVE_AT_S + 5.0)
    resumed = [
        seq for inst in sim.instances.values() for seq in [*inst.running.values(), *inst.waiting]
        if seq.traj.index in kept
    ]
    assert resumed
    for seq in resumed:
        assert seq.reserve == seq.traj.ctx + 6_000
        assert seq.prefill_left + seq.ctx == seq.traj.ctx + kept[seq.traj.index]
    _finish(sim)


def test_migrate_finishes_sooner_than_restart() -> None:
    ends = {}
    for name in ("restart_all", "migrate"):
        sim = _started(name)
        apply_plan(sim, Plan(START.train, (TP8, TP8, (4, 4))), MOVE_AT_S)
        _finish(sim)
        ends[name] = sim.last_done_s
    assert ends["migrate"] < ends["restart_all"]


def test_drain_finishes_current_turns_on_the_old_node_then_replaces_it() -> None:
    sim = _started("drain")
    on_node = _decoding_on(sim, 3)
    old_iids = {i for i, inst in sim.instances.items() if inst.node == 3}
    apply_plan(sim, Plan(START.train, (TP8, TP8, (4, 4))), MOVE_AT_S)
    # Still generating there, but routing skips the node.
    assert [t.index for t in _decoding_on(sim, 3)] == [t.index for t in on_node]
    assert all(not sim.loads[i].is_live for i in old_iids)
    assert sim.transition is not None
    record = _finish(sim)
    assert record["lost_tokens"] == 0 and record["kept_tokens"] == 0
    (op,) = record["ops"]
    # Released when its last turn ended (no sooner), then loaded its weights.
    assert op["released_s"] > MOVE_AT_S + 5.0
    assert op["up_s"] > op["released_s"]
    # A single-turn trajectory finished there; a two-turn one took its second turn
    # elsewhere (the instance it was last placed on).
    assert {len(t.rec.turns) for t in on_node} == {1, 2}
    for t in on_node:
        assert (t.instance == "n0003-i0-tp8") == (len(t.rec.turns) == 1)


def test_staged_changes_one_node_at_a_time() -> None:
    target = Plan(START.train, ((4, 4), (4, 4), (4, 4)))
    sim = _started("staged", stage_nodes=1)
    apply_plan(sim, target, MOVE_AT_S)
    record = _finish(sim)
    assert record["max_nodes_out"] == 1
    ops = sorted(record["ops"], key=lambda op: op["begin_s"])
    for before, after in zip(ops, ops[1:], strict=False):
        assert after["begin_s"] >= before["up_s"]
    sim = _started("drain")
    apply_plan(sim, target, MOVE_AT_S)
    assert _finish(sim)["max_nodes_out"] == 3


def test_staged_two_at_a_time_never_has_more_out() -> None:
    sim = _started("staged", stage_nodes=2)
    apply_plan(sim, Plan(START.train, ((4, 4), (4, 4), (4, 4))), MOVE_AT_S)
    assert _finish(sim)["max_nodes_out"] == 2


def test_prewarm_loads_nodes_from_training_before_releasing_old_ones() -> None:
    # Training 8 -> 0 is not a plan; take one rollout node's pattern change plus a
    # training node turned rollout: 2 training nodes -> 1.
    start = Plan(TrainParallelism(8, 1, 2), (TP8, TP8))
    sim = Simulator(CLUSTER, _trace(), _system("prewarm"), start)
    rl_loop.release_allowed(sim, 0.0)
    sim.run_until(MOVE_AT_S)
    apply_plan(sim, Plan(TrainParallelism(8, 1, 1), (TP8, TP8, (4, 4))), MOVE_AT_S)
    record = _finish(sim)
    warm = next(op for op in record["ops"] if op["old"] is None)
    changed = next(op for op in record["ops"] if op["old"] is not None)
    assert warm["begin_s"] == MOVE_AT_S
    assert changed["begin_s"] >= warm["up_s"] > MOVE_AT_S


def test_a_node_leaving_for_training_joins_once_drained() -> None:
    sim = _started("drain")
    target = Plan(TrainParallelism(8, 1, 2), (TP8, TP8))
    apply_plan(sim, target, MOVE_AT_S)
    assert sim.plan is START  # the trainer keeps its group while node 1 drains
    record = _finish(sim)
    assert sim.plan is target
    assert record["train_switch_s"] > MOVE_AT_S


def test_every_strategy_runs_a_move_to_the_end() -> None:
    for name in moves.RECONFIGURE_STRATEGIES:
        sim = _started(name)
        apply_plan(sim, Plan(TrainParallelism(8, 1, 2), ((4, 4), TP8)), MOVE_AT_S)
        record = _finish(sim)
        assert record["strategy"] == name and record["end_s"] >= MOVE_AT_S


@pytest.mark.parametrize(
    ("field", "value"),
    [("reconfigure_strategy", "blue_green"), ("reconfigure_strategy", None),
     ("reconfigure_stage_nodes", 0), ("reconfigure_stage_nodes", True)],
)
def test_bad_reconfigure_options_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        SystemConfig(name="t", policy="least_loaded", **{field: value})
    assert err.value.field == field


@pytest.mark.parametrize(("keeps", "strategy"), [(True, "migrate"), (False, "migrate"),
                                                 (True, "drain")])
def test_a_node_lent_to_training_keeps_tokens_only_under_migrate_when_asked(
    keeps: bool, strategy: str
) -> None:
    from dataclasses import replace

    sim = _started(strategy)
    sim.system = replace(sim.system, pool_keeps_partial=keeps)
    on_node = _decoding_on(sim, 3)
    sim.pool.resize(1, [1, 2, 3], MOVE_AT_S)  # lends the highest-numbered node
    assert sim.pool.nodes == [3]
    kept = [t.partial_tokens for t in on_node]
    if keeps and strategy == "migrate":
        assert all(k > 0 for k in kept)
    else:
        assert kept == [0] * len(on_node)
    sim.pool.resize(0, [1, 2], MOVE_AT_S + 1.0)
    assert _finish(sim) is None  # the pool's loans are not planner moves


@pytest.mark.parametrize("name", ["staged", "staged_migrate", "restart_all"])
def test_a_move_that_only_hands_nodes_to_training_is_recorded_once(name: str) -> None:
    sim = _started(name)
    apply_plan(sim, Plan(TrainParallelism(8, 1, 3), (TP8,)), MOVE_AT_S)
    _finish(sim)
    assert len(sim.move_log) == 1 and sim.plan.train.dp == 3
