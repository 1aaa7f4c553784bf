"""The real-service policy benchmark's arithmetic (issue 20 item 7): arms alternated,
time to a target reward, the summary. The runs themselves need the whole stack and
minutes each; ``python -m benchmarks.bench_real_policies`` does them."""

from __future__ import annotations

import pytest

from benchmarks.bench_real_policies import alternated, main, summarise, time_to_target_s
from scheduling.policy.registry import POLICY_NAMES


def test_each_seed_rotates_the_arm_order() -> None:
    assert alternated(["a", "b", "c"], [0, 1, 2, 3]) == [
        (0, "a"), (0, "b"), (0, "c"),
        (1, "b"), (1, "c"), (1, "a"),
        (2, "c"), (2, "a"), (2, "b"),
        (3, "a"), (3, "b"), (3, "c"),
    ]


def test_time_to_target_is_the_end_of_the_first_window_that_reaches_it() -> None:
    steps = [{"wall_s": 2.0, "reward_mean": r} for r in (0.1, 0.6, 0.3, 0.6, 0.7, 0.2)]
    assert time_to_target_s(steps, 0.5, window=1) == 4.0
    assert time_to_target_s(steps, 0.52, window=3) == 10.0  # (0.3 + 0.6 + 0.7) / 3 = 0.53
    assert time_to_target_s(steps, 0.9, window=1) is None
    with pytest.raises(ValueError, match="--window"):
        time_to_target_s(steps, 0.5, window=0)


def test_summary_counts_failures_and_runs_that_never_reach_the_target() -> None:
    runs = [
        {"policy": "cmlfq", "ok": True, "trajectories_per_s": 2.0, "time_to_target_s": 10.0,
         "reward_last_10pct": 0.5},
        {"policy": "cmlfq", "ok": True, "trajectories_per_s": 4.0, "time_to_target_s": None,
         "reward_last_10pct": 0.3},
        {"policy": "cmlfq", "ok": False},
    ]
    row = summarise(runs, ["cmlfq", "least_loaded"])
    assert row["cmlfq"]["runs"] == 2 and row["cmlfq"]["failed"] == 1
    assert row["cmlfq"]["traj_per_s_mean"] == 3.0
    assert row["cmlfq"]["traj_per_s_range"] == [2.0, 4.0]
    assert row["cmlfq"]["reached_target"] == 1
    assert row["cmlfq"]["time_to_target_s_mean"] == 10.0
    assert row["least_loaded"]["runs"] == 0 and row["least_loaded"]["traj_per_s_mean"] is None


def test_default_arms_are_the_registry_and_unknown_ones_are_refused(capsys) -> None:
    assert main(["--policies", "cmlfq,nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown policies ['nope']" in err
    for name in POLICY_NAMES:
        assert name in err
