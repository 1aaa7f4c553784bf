"""The twin on worker processes (issue 20, session 18): a decision's runs spread over a
pool give the scores, the pick and the run count of the one-process twin."""

from __future__ import annotations

import pytest

from benchmarks.bench_sim_speed import decision_setup
from libra.errors import InvalidArgument
from scheduling.planner import PlanSearch, Workload
from sim.generators import GeneratorConfig
from sim.presets import cluster
from sim.systems import system
from sim.twin import TwinRefiner


def _decision(workers: int) -> tuple[PlanSearch, Workload, TwinRefiner]:
    """The search after 5 observed steps of search seed 0, as bench_sim_speed times it."""
    config = GeneratorConfig(shape="search", num_steps=6, prompts_per_step=16, seed=0)
    return decision_setup(config, workers)


def test_a_pool_scores_every_plan_as_one_process_does() -> None:
    search, work, alone = _decision(1)
    plans = [s.plan for s in search.candidates(search.cost_model(work), work)]
    _, _, pooled = _decision(2)
    try:
        assert pooled.rollout_s_many(plans, work) == [alone.rollout_s(p, work) for p in plans]
        assert pooled.runs == alone.runs == len({p.key() for p in plans})
        assert pooled.rollout_s_many(plans[:1], work) == [alone.rollout_s(plans[0], work)]
        assert pooled.runs == len({p.key() for p in plans})  # cached: no run
    finally:
        pooled.close()


def test_a_search_in_waves_picks_the_one_by_one_plan_and_score() -> None:
    search, work, alone = _decision(1)
    best = search.search(work)
    waves, work2, pooled = _decision(2)
    try:
        picked = waves.search(work2)
    finally:
        pooled.close()
    assert best is not None and picked is not None
    assert (picked.plan.key(), picked.objective_s) == (best.plan.key(), best.objective_s)
    # A wave may refine a candidate the one-by-one order pruned, never fewer.
    assert pooled.runs >= alone.runs


def test_a_closed_twin_still_scores_in_its_own_process() -> None:
    search, work, twin = _decision(2)
    plans = [s.plan for s in search.candidates(search.cost_model(work), work)][:2]
    twin.close()
    twin.close()  # twice: no error
    assert all(score > 0 for score in twin.rollout_s_many(plans, work))
    twin.close()


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_bad_worker_counts_are_refused_naming_the_field(workers: object) -> None:
    with pytest.raises(InvalidArgument, match="workers"):
        TwinRefiner(cluster("a800x48"), system("libra"), workers=workers)  # type: ignore[arg-type]
