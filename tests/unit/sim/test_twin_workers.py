"""The twin on worker processes (issue 20, session 18): a decision's runs spread over a
pool give the scores, the pick and the run count of the one-process twin."""

from __future__ import annotations

import pytest

from benchmarks.bench_sim_speed import decision_setup
from libra.errors import InvalidArgument
from scheduling.planner import Plan, PlanSearch, TrainParallelism, Workload
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


IN_FORCE = Plan(TrainParallelism(8, 1, 2), ((4, 4), (8,), (8,), (8,)))
"""A plan in force that is none of the search's candidates (a mix at 16:32)."""


@pytest.mark.parametrize("workers", [1, 2])
def test_the_plan_in_force_is_scored_in_the_first_wave_and_the_pick_is_unchanged(
    workers: int,
) -> None:
    search, work, plain = _decision(workers)
    try:
        best = search.search(work)
        runs = plain.runs
    finally:
        plain.close()
    search, work, twin = _decision(workers)
    calls: list[list[tuple]] = []
    many = twin.rollout_s_many
    twin.rollout_s_many = lambda plans, w: calls.append([p.key() for p in plans]) or many(plans, w)
    try:
        picked = search.search(work, prefetch=(IN_FORCE,))
        assert calls[0][0] == IN_FORCE.key() and len(calls[0]) == max(2, workers)
        after = twin.runs
        if workers == 1:  # one by one, the same candidates and the plan in force once
            assert after == runs + 1
        twin.rollout_s(IN_FORCE, work)
        assert twin.runs == after  # then read from the cache
    finally:
        twin.close()
    assert best is not None and picked is not None
    assert (picked.plan.key(), picked.objective_s) == (best.plan.key(), best.objective_s)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_bad_worker_counts_are_refused_naming_the_field(workers: object) -> None:
    with pytest.raises(InvalidArgument, match="workers"):
        TwinRefiner(cluster("a800x48"), system("libra"), workers=workers)  # type: ignore[arg-type]


def test_a_prefetch_scores_plans_at_once_for_the_cache() -> None:
    search, work, twin = _decision(2)
    plans = [IN_FORCE, *(s.plan for s in search.candidates(search.cost_model(work), work))][:2]
    try:
        search.prefetch(plans, work)
        assert twin.runs == 2
        assert [search.score(p, work).rollout_s for p in plans] == [
            twin.rollout_s(p, work) for p in plans]
        assert twin.runs == 2  # read from the cache
        search.prefetch(plans[:1], work)  # one plan: nothing to batch
        assert twin.runs == 2
    finally:
        twin.close()
