"""The sensitivity table (issue 20 item 1): one row per constant x level x workload."""

from __future__ import annotations

import pytest

from sim.sensitivity import flips, run_sensitivity, table


def test_rows_rank_every_system_at_each_level() -> None:
    result = run_sensitivity(
        shapes=("math",), systems=("async-lb", "libra"), constants=("train_mfu",)
    )
    rows = result["rows"]
    assert [(r["level"], r["workload"]) for r in rows] == [
        ("low", "math"), ("central", "math"), ("high", "math"),
    ]
    for r in rows:
        assert sorted(r["ranking"]) == ["async-lb", "libra"]
        values = [r["throughput"][n] for n in r["ranking"]]
        assert values == sorted(values, reverse=True) and values[-1] > 0
    # Training MFU sets the training step time, so each level is a different run.
    low, central, high = (r["throughput"]["async-lb"] for r in rows)
    assert len({low, central, high}) == 3
    assert rows[0]["value"] == pytest.approx(0.30) and rows[2]["value"] == pytest.approx(0.50)
    text = table(result)
    assert "train_mfu" in text and "libra" in text
    assert isinstance(flips(result), list)


def test_unknown_constant_fails_before_any_run() -> None:
    with pytest.raises(ValueError, match="unknown constant 'nvlink_bw'"):
        run_sensitivity(constants=("nvlink_bw",))
