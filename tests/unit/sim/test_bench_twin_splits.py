"""The twin-vs-simulation benchmark's options (issue 20, session 19): variants by name
and by slice size, and bad ones exit 2 naming the option before any run."""

from __future__ import annotations

import pytest

from benchmarks import bench_twin_splits


@pytest.mark.parametrize(
    ("argv", "message"),
    [(("--twins", "s16,nope"), "--twins"), (("--slice-nodes", "0"), "--slice-nodes"),
     (("--slice-nodes", "x"), "--slice-nodes"), (("--gpus", "64"), "--gpus"),
     (("--decisions", "0", "--steps", "11"), "--steps"),
     (("--decisions", "5,10", "--steps", "15"), "--steps")],
)
def test_bad_options_exit_2_naming_the_option(refused, argv: tuple, message: str) -> None:
    refused(bench_twin_splits.main, argv, message)


def test_a_slice_size_adds_a_sliced_variant_and_s16_is_the_whole_fleet() -> None:
    import argparse

    twins = bench_twin_splits._variants(argparse.ArgumentParser(), "s16,s19", "25")
    assert list(twins) == ["s16", "s19", "slice25"]
    assert twins["s16"]["slice_nodes"] is None and "slice_nodes" not in twins["s19"]
    assert twins["slice25"] == {**twins["s19"], "slice_nodes": 25}
    assert bench_twin_splits.min_steps([5]) == 11
    assert bench_twin_splits.min_steps([0, 5, 10]) == 16
    assert bench_twin_splits.min_steps([0]) == 12
