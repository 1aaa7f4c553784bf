"""The planner's twin (issue 20 item 5, first and fifth bullets): candidate plans scored
by simulating the recent history with the real policy, and one pipeline depth."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from libra.jobspec import ElasticSpec
from scheduling.planner import (
    ClusterShape,
    PlanError,
    PlanSearch,
    RequestStats,
    SearchSpace,
    Workload,
    pipeline_depth,
)
from scheduling.planner.live import LiveConfig, live_planner
from sim.engine import Simulator
from sim.generators import GeneratorConfig, generate
from sim.presets import cluster
from sim.run import initial_plan
from sim.systems import system
from sim.twin import TwinRefiner, steady_step_s

SPEC = cluster("a800x48")
HISTORY_STEPS = 5


def _setup(shape: str, seed: int, consumption: str = "bounded"):
    trace = generate(GeneratorConfig(shape=shape, num_steps=20, prompts_per_step=16, seed=seed))
    libra = replace(system("libra"), consumption=consumption)
    twin = TwinRefiner(SPEC, libra)
    history = []
    for step in range(HISTORY_STEPS):
        batch = [t for t in trace if t.step == step]
        twin.observe_step(batch)
        history += [RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s) for t in batch]
    search = PlanSearch(
        SPEC.hardware, SPEC.model, ClusterShape(SPEC.num_nodes, 8),
        SearchSpace(node_patterns=libra.node_patterns, train_tp=8), refiner=twin,
    )
    work = Workload(64, tuple(history), pipeline_depth(libra.staleness))
    return trace, libra, twin, search, work


def _simulated_step_s(trace, libra, plan) -> float:
    """Mean step interval between the fill and the drain of the whole trace run at
    ``plan``, statically (the twin predicts a live job's steady state)."""
    static = replace(libra, enable_replan=False, enable_elastic=False)
    raw = Simulator(SPEC, trace, static, plan, None).run()
    return steady_step_s(raw["train_log"], pipeline_depth(libra.staleness))


def test_twin_agrees_with_the_simulation_on_the_candidates_it_ranks() -> None:
    # The closed form models a per-step barrier (a step waits for its own trajectories).
    trace, libra, twin, search, work = _setup("r2e", 0, consumption="barrier")
    model = search.cost_model(work)
    candidates = search._closed_form_top_k(model, work, 1.0, 1.0)
    candidates += search._best_uniform(model, work, candidates)
    assert len(candidates) == 4
    for cand in candidates:
        predicted = max(cand.train_s, search.rollout_s(model, cand.plan, work, greedy=True))
        simulated = _simulated_step_s(trace, libra, cand.plan)
        assert predicted == pytest.approx(simulated, rel=0.15), cand.plan.to_dict()


def test_search_prunes_candidates_that_cannot_win_exactly() -> None:
    _, _, twin, search, work = _setup("r2e", 1)
    best = search.search(work)
    assert search.pruned >= 1  # training alone outlasts the best objective: not refined
    # Exact: the best of every candidate, each refined, is the same plan.
    model = search.cost_model(work)
    candidates = search._closed_form_top_k(model, work, 1.0, 1.0)
    candidates += search._best_uniform(model, work, candidates)
    candidates += search._homogeneous_per_split(model, work, candidates)
    full = min(
        (max(c.train_s, twin.rollout_s(c.plan, work)) for c in candidates),
    )
    assert best is not None and best.objective_s == full


def test_search_refines_with_the_twin_and_caches_per_history() -> None:
    _, _, twin, search, work = _setup("math", 1)
    best = search.search(work)
    assert best is not None and math.isfinite(best.objective_s)
    runs = twin.runs
    # Top candidates, the uniform guard and each top split's homogeneous layout, less
    # the mixes not clearly ahead (session 17): each simulated once unless pruned.
    model = search.cost_model(work)
    cands = search.candidates(model, work)
    assert len(cands) > 4
    assert runs >= 1 and runs + search.pruned == len(cands)
    search.search(work)
    assert twin.runs == runs  # same history: cached
    twin.observe_step([])  # an empty step changes nothing
    assert twin.runs == runs


def test_twin_without_history_scores_nothing() -> None:
    twin = TwinRefiner(SPEC, system("libra"))
    plan, *_ = initial_plan(SPEC, generate(GeneratorConfig(shape="math", num_steps=2)),
                            system("async-lb"))
    assert twin.rollout_s(plan, None) == math.inf


def test_live_planner_and_simulator_read_one_pipeline_depth() -> None:
    assert pipeline_depth(0) == 1 and pipeline_depth(4) == 5
    live = live_planner(ElasticSpec(), max_staleness=4)
    assert live.config.planner_config().pipeline_depth == pipeline_depth(4)
    assert LiveConfig().planner_config().pipeline_depth == pipeline_depth(1)
    trace = generate(GeneratorConfig(shape="math", num_steps=3, prompts_per_step=4))
    _, planner, _, _ = initial_plan(SPEC, trace, system("libra"))
    assert planner is not None
    assert planner._config.pipeline_depth == pipeline_depth(system("libra").staleness)
    for bad in (-1, 1.5, True):
        with pytest.raises(PlanError, match="max_staleness"):
            pipeline_depth(bad)

