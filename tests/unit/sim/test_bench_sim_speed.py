"""The simulator-speed benchmark's options (issue 20, session 15): bad arms and rounds
are refused before any run; one worker round in this tree reports what it measured."""

from __future__ import annotations

import pytest

from benchmarks import bench_sim_speed
from sim.generators import GeneratorConfig
from sim.twin_slice import TWIN_SLICE_NODES


@pytest.mark.parametrize(
    ("argv", "message"),
    [(("--arms", "/nonexistent-tree"), "--arms"), (("--rounds", "0"), "--rounds"),
     (("--twin-workers", "1,0"), "--twin-workers"), (("--twin-workers", "x"), "--twin-workers"),
     (("--gpus", "64"), "--gpus")],
)
def test_bad_options_exit_2_naming_the_option(refused, argv: tuple, message: str) -> None:
    refused(bench_sim_speed.main, argv, message)


def test_summary_takes_medians_and_the_first_rounds_picks() -> None:
    rounds = [
        {"decisions": [{"cpu_s": c, "wall_s": 2 * c, "twin_runs": r, "rollout_s": 7.0,
                        "plan": "p"}
                       for c, r in ((0.1, 2), (0.3, 4), (0.2, 3))], "load": load}
        for load in (1.0, 2.0)
    ]
    got = bench_sim_speed._summary(rounds)
    assert got["decision_cpu_median_s"] == 0.2 and got["decision_cpu_max_s"] == 0.3
    assert got["twin_runs"] == [2, 4] and got["load"] == [1.0, 2.0]
    assert got["picked_rollout_s"] == [7.0, 7.0, 7.0] and "cell" not in got
    assert got["picked_plans"] == ["p", "p", "p"]


def test_a_cell_is_workload_seed_gpus_system() -> None:
    out = bench_sim_speed._cell("math:0:48:sync-lb")
    assert out["cell"] == "math:0:48:sync-lb" and out["cpu_s"] > 0
    assert out["throughput_traj_per_s"] > 0


def test_a_decision_at_1000_gpus_searches_the_large_fleet_on_a_slice() -> None:
    config = GeneratorConfig(shape="math", num_steps=6, prompts_per_step=320, seed=0)
    search, work, twin = bench_sim_speed.decision_setup(config, gpus=1000)
    assert search.cluster.num_nodes == 125 and work.requests_per_step == 1280
    assert search.search(work) is not None
    assert twin._run_shape()[3] == 125 // TWIN_SLICE_NODES  # the twin ran a slice


def test_decisions_in_a_run_are_timed_and_the_run_is_the_plain_runs() -> None:
    from sim.paper import SCALES, _trace
    from sim.presets import cluster
    from sim.run import run
    from sim.systems import system

    got = bench_sim_speed._run_decisions("math", 0, 1, 48)
    assert got["decisions"] and all(d["twin_runs"] >= 1 and d["wall_s"] > 0
                                    for d in got["decisions"])
    plain = run(cluster("a800x48"), _trace(SCALES[48], "math", 0), system("libra"))
    assert got["throughput_traj_per_s"] == plain["throughput_traj_per_s"]


def test_the_summary_pools_the_decisions_of_every_run() -> None:
    decisions = [{"cpu_s": 0.1, "wall_s": 0.2, "twin_runs": 2, "rollout_s": 7.0, "plan": "p"}]
    runs = [{"decisions": [{"wall_s": w, "cpu_s": w / 2, "twin_runs": 3} for w in (0.2, 0.6)],
             "throughput_traj_per_s": 1.5, "shape": "math", "seed": 0}]
    rounds = [{"decisions": decisions, "runs": runs, "load": 1.0}] * 2
    got = bench_sim_speed._summary(rounds)["in_runs"]
    assert got["decisions"] == 4 and got["wall_median_s"] == 0.4 and got["wall_max_s"] == 0.6
    assert got["cpu_max_s"] == 0.3 and got["throughputs"] == [1.5]
