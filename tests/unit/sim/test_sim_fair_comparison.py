"""A fair comparison (issue 20 item 4): reference split, oracle sweep, its bad input."""

from __future__ import annotations

import pytest

from libra.errors import InvalidArgument
from sim import paper, presets, sweep
from sim.generators import GeneratorConfig, generate
from sim.run import run
from sim.systems import STATIC_PEERS, SYSTEM_NAMES, reference_train_gpus, system
from sim.trace import TraceTrajectory, Turn

CLUSTER = presets.cluster("a800x48")
TINY = {"cluster": "a800x48", "prompts_per_step": 2, "num_steps": 2}


def _trace(seed: int = 0) -> list[TraceTrajectory]:
    return generate(GeneratorConfig(shape="search", num_steps=2, prompts_per_step=2, seed=seed))


def test_reference_split_is_32_of_48_and_scales_by_nodes() -> None:
    assert reference_train_gpus(6, 8) == 32
    assert reference_train_gpus(125, 8) == 83 * 8
    assert reference_train_gpus(2, 8) == 8  # both stages keep a node


def test_peer_at_the_reference_split_runs_there() -> None:
    arm = system("async-lb").with_split(32, (2, 2, 2, 2), "reference")
    res = run(CLUSTER, _trace(), arm)
    assert res["initial_plan"]["train_gpus"] == 32 and res["initial_plan"]["rollout_gpus"] == 16
    assert res["initial_plan"]["rollout_tps"] == {2: 8}


@pytest.mark.parametrize("name", ["async-lb", "length-aware", "la-mlfq"])
def test_a_static_peer_without_a_split_runs_at_the_reference_split_for_every_seed(
    name: str,
) -> None:
    plans = [run(CLUSTER, _trace(seed), system(name))["initial_plan"] for seed in (0, 1, 2)]
    assert all(p == plans[0] for p in plans)
    assert (plans[0]["train_gpus"], plans[0]["rollout_gpus"]) == (32, 16)


def test_only_static_peers_take_a_split_and_toolcount_is_not_compared() -> None:
    assert set(STATIC_PEERS) == {
        "async-lb", "length-aware", "stream-lb", "stream-lb-unbounded", "la-mlfq"
    }
    assert "toolcount" not in SYSTEM_NAMES
    for name in ("libra", "sync-lb"):
        with pytest.raises(ValueError, match="static split"):
            system(name).with_split(32, (2, 2, 2, 2), "reference")


def test_oracle_picks_the_best_cell_of_its_grid() -> None:
    best = sweep.best_static(
        CLUSTER, [_trace()], "async-lb", splits=(16, 40), layouts=((8,), (2, 2, 2, 2))
    )
    assert len(best["grid"]) == 4
    top = max(g["throughput"] for g in best["grid"])
    assert best["throughput_traj_per_s"] == top
    cell = next(g for g in best["grid"] if g["throughput"] == top)
    assert (best["train_gpus"], best["pattern"]) == (cell["train_gpus"], cell["pattern"])


def test_oracle_split_does_not_depend_on_the_seeds_under_test(monkeypatch) -> None:
    monkeypatch.setitem(paper.SCALES, 48, TINY)
    kw = {"shapes": ("search",), "systems": ("sync-lb", "async-lb"), "oracle": True}
    a = paper.run_paper(48, 1, **kw)
    b = paper.run_paper(48, 2, held_out=True, **kw)
    assert b["seed_list"] == [10, 11] and a["seed_list"] == [0]
    assert a["oracle_choices"] == b["oracle_choices"]
    assert set(a["cells"]["search"]) == {"sync-lb", "async-lb", "async-lb@oracle"}
    ratios = a["summary"]["search"]
    assert "async-lb" in ratios and "async-lb@oracle" in ratios


@pytest.mark.parametrize("name", ["libra", "sync-lb", "toolcount", "nope"])
def test_sweep_rejects_a_system_that_is_not_a_static_peer(name: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        sweep.best_static(CLUSTER, [_trace()], name)
    assert err.value.field == "system" and name in str(err.value)


@pytest.mark.parametrize("train_gpus", [0, 12, 48, 56])
def test_sweep_rejects_a_split_that_is_not_whole_nodes_with_both_stages(train_gpus: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        sweep.best_static(CLUSTER, [_trace()], "async-lb", splits=(train_gpus,))
    assert err.value.field == "split" and str(train_gpus) in str(err.value)


def test_sweep_rejects_a_layout_that_does_not_fill_a_node() -> None:
    with pytest.raises(InvalidArgument) as err:
        sweep.best_static(CLUSTER, [_trace()], "async-lb", layouts=((2, 2),))
    assert err.value.field == "layout"


def test_sweep_names_the_trajectory_a_layout_cannot_hold() -> None:
    huge = TraceTrajectory("the-long-one", "p", "g", 0, 10, (Turn(400_000),))
    with pytest.raises(InvalidArgument) as err:
        sweep.best_static(CLUSTER, [[*_trace(), huge]], "async-lb", layouts=((1,) * 8,))
    assert err.value.field == "layout"
    assert "the-long-one" in str(err.value) and "TP1" in str(err.value)


def test_bench_rejects_unknown_systems_before_running() -> None:
    with pytest.raises(ValueError, match="unknown system"):
        paper.run_paper(48, 1, systems=("sync-lb", "toolcount"))


# Every bucket reachable (issue 20 item 5), end to end in the simulator.


def _two_node_run(rules: dict) -> dict:
    from dataclasses import replace

    from scheduling.planner import Plan, TrainParallelism
    from scheduling.policy import CmlfqConfig
    from sim.engine import Simulator

    spec = presets.cluster("a800x24")
    conf = replace(
        system("libra"),
        enable_replan=False,
        enable_elastic=False,
        node_patterns=((1, 1, 2, 4), (8,)),
        policy_config=CmlfqConfig(rebuild_interval_steps=5, **rules),
    )
    tr = generate(GeneratorConfig(shape="r2e", num_steps=4, prompts_per_step=4, seed=0))
    plan = Plan(TrainParallelism(8, 1, 1), ((1, 1, 2, 4), (8,)))
    return Simulator(spec, tr, conf, plan).run()


def test_a_tp8_bucket_above_the_workload_gets_work_under_libra_rules_only() -> None:
    reference = _two_node_run(
        {
            "entry": "shortest",
            "disagree_rule": "stay",
            "live_thresholds": False,
            "min_node_visits": 1,
            "max_queue_length": 0,
        }
    )
    libra = _two_node_run({})
    assert reference["bucket_busy_fraction"]["tp8"] == 0.0
    assert all(v > 0.0 for v in libra["bucket_busy_fraction"].values()), libra[
        "bucket_busy_fraction"
    ]
    assert libra["idle_while_queued"] == {}


def test_bench_cli_exits_2_on_bad_input(tmp_path, capsys) -> None:
    from libra_cli.main import main

    assert main(["bench", "paper", "--seeds", "0", "--out-dir", str(tmp_path)]) == 2
    assert "--seeds must be positive" in capsys.readouterr().err
