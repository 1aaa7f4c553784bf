"""The replanning-headroom benchmark (issue 20, session 18): its static arm is the
simulator's own static run, a scheduled move changes the run, and the summary takes
each seed's best schedule, never below the best static plan."""

from __future__ import annotations

import pytest

from benchmarks import bench_replan_headroom as bench
from sim.paper import SCALES, _trace
from sim.presets import cluster
from sim.run import run


def test_a_static_schedule_is_the_simulators_static_run() -> None:
    arm = bench.static_system("stream-lb").with_split(16, (8,), "headroom")
    expected = run(cluster("a800x48"), _trace(SCALES[48], "math", 0), arm)
    got = bench.scheduled_throughput(("stream-lb", "math", 0, (8,), 16, ()))
    assert got == expected["throughput_traj_per_s"]


def test_a_move_after_a_step_changes_the_run() -> None:
    static = bench.scheduled_throughput(("libra", "math", 0, (8,), 16, ()))
    moved = bench.scheduled_throughput(("libra", "math", 0, (8,), 16, ((5, 32),)))
    back = bench.scheduled_throughput(("libra", "math", 0, (8,), 16, ((5, 32), (10, 16))))
    assert None not in (static, moved, back) and len({static, moved, back}) == 3


def test_schedules_are_static_plans_and_moves_to_another_split_at_rising_steps() -> None:
    one = bench.schedules((8, 16), [10, 5], 1)
    assert one == [(8, ()), (16, ()), (8, ((5, 16),)), (16, ((5, 8),)), (8, ((10, 16),)),
                   (16, ((10, 8),))]
    two = bench.schedules((8, 16), [5, 10], 2)
    assert two[len(one):] == [(8, ((5, 16), (10, 8))), (16, ((5, 8), (10, 16)))]


def test_the_summary_keeps_each_seeds_best_and_never_goes_below_static() -> None:
    tasks = [
        ("libra", "w", 0, (8,), 16, ()), ("libra", "w", 0, (8,), 24, ()),
        ("libra", "w", 0, (8,), 16, ((5, 24),)), ("libra", "w", 0, (4, 4), 16, ()),
        ("libra", "w", 1, (8,), 16, ()), ("libra", "w", 1, (8,), 16, ((5, 24),)),
    ]
    rows = bench.summarise(tasks, [1.0, 1.2, 1.5, 1.1, 2.0, 1.0])
    seeds = rows[0]["seeds"]
    assert [s["static"] for s in seeds] == [1.2, 2.0]
    assert seeds[0]["best_plan"] == "16 -> 24 after step 5 x [8]"
    assert [s["headroom"] for s in seeds] == [1.25, 1.0]
    assert seeds[0]["static_by_pattern"] == {"8": 1.2, "4,4": 1.1}


@pytest.mark.parametrize(
    ("option", "value"),
    [("--patterns", "8,1"), ("--switch-after", "0"), ("--seeds", "x"), ("--moves", "3")],
)
def test_bad_options_are_refused_naming_them(refused, option: str, value: str) -> None:
    refused(bench.main, (option, value), option)
