"""The parallel-decision benchmark (issue 20, session 17): a search done in waves over a
process pool picks the plan and score the sequential search picks."""

from __future__ import annotations

import multiprocessing
import sys

import pytest

from benchmarks import bench_parallel_decision as bench


def test_one_worker_is_refused_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench_parallel_decision.py", "--workers", "1"])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2 and "--workers" in capsys.readouterr().err


def test_waves_pick_the_sequential_plan_and_score() -> None:
    twin, search, work, _ = bench._setup("search", 0)
    best = search.search(work)
    _, search2, work2, steps = bench._setup("search", 0)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        objective, key, runs = bench._parallel(pool, 2, search2, work2, steps)
    assert (objective, key) == (best.objective_s, best.plan.key())
    assert runs >= twin.runs  # a wave may start a run the sequential order pruned
