"""The preflight adopts a homogeneous layout until an online decision has evidence for
a mix, and a borrow of the elastic pool is judged by the search (issue 20, session 16)."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

import sim.run as sim_run
from scheduling.planner import (
    ClusterShape,
    GlobalResourcePlanner,
    Plan,
    PlanError,
    PlanEvent,
    PlannerConfig,
    PlanSearch,
    RequestStats,
    Scored,
    SearchSpace,
    StepMetrics,
    Workload,
    pipeline_depth,
)
from scheduling.planner import TrainParallelism as TP
from scheduling.planner.elastic_trigger import ElasticTrigger
from sim.generators import GeneratorConfig, generate
from sim.presets import cluster
from sim.systems import LIBRA_PATTERNS, system
from sim.twin import TwinRefiner

SPEC = cluster("a800x48")
SHAPE = ClusterShape(SPEC.num_nodes, 8)
HISTORY = tuple(
    RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s)
    for t in generate(GeneratorConfig(shape="r2e", num_steps=1, prompts_per_step=16, seed=0))
)


def _one_tp(plan: Plan) -> bool:
    return len(set(plan.rollout_tps)) == 1


def _planner(preflight: str, **space: object) -> GlobalResourcePlanner:
    search = PlanSearch(SPEC.hardware, SPEC.model, SHAPE,
                        SearchSpace(node_patterns=LIBRA_PATTERNS, train_tp=8, **space))
    planner = GlobalResourcePlanner(
        search, PlannerConfig(pipeline_depth=pipeline_depth(4), preflight_layouts=preflight)
    )
    planner.add_history(list(HISTORY))
    return planner


def test_homogeneous_preflight_adopts_one_tp_degree_where_any_adopts_a_mix() -> None:
    mixed = _planner("any")
    mixed.preflight(len(HISTORY))
    assert mixed.current is not None and not _one_tp(mixed.current)  # the closed form's mix
    homogeneous = _planner("homogeneous")
    event = homogeneous.preflight(len(HISTORY))
    assert event.applied and homogeneous.current is not None
    assert _one_tp(homogeneous.current)


def test_homogeneous_candidates_cover_each_top_split_and_hold_no_mix() -> None:
    search = PlanSearch(SPEC.hardware, SPEC.model, SHAPE,
                        SearchSpace(node_patterns=LIBRA_PATTERNS, train_tp=8))
    work = Workload(len(HISTORY), HISTORY, pipeline_depth(4))
    model = search.cost_model(work)
    top = search._closed_form_top_k(model, work, 1.0, 1.0)
    only = search.candidates(model, work, homogeneous_only=True)
    assert only and all(_one_tp(c.plan) for c in only)
    assert {c.plan.train_gpus for c in only} == {c.plan.train_gpus for c in top}
    best = search.search(work, homogeneous_only=True)
    assert best is not None and _one_tp(best.plan)


def test_bad_preflight_options_name_the_field() -> None:
    with pytest.raises(PlanError, match="preflight_layouts"):
        PlannerConfig(preflight_layouts="mixed")
    with pytest.raises(PlanError, match="preflight_layouts"):
        _planner("homogeneous", require_heterogeneous=True)
    with pytest.raises(PlanError, match="elastic_borrow_judged"):
        PlannerConfig(elastic_borrow_judged="yes")  # type: ignore[arg-type]


PLAN = Plan(TP(8, 1, 2), ((8,),) * 4)  # 32 rollout GPUs, reserve 8 -> 3 replicas
POOL = PlannerConfig(pipeline_depth=5, elastic_span_alpha=0.5, elastic_dwell_steps=3)


def _borrow_step(trigger: ElasticTrigger, step: int, judge) -> object:
    # 100 s of training against 250 / 5 = 50 s of rollout: the ratio says borrow.
    m = StepMetrics(step=step, rollout_s=100.0, train_s=100.0, rollout_span_s=250.0)
    trigger.observe(m)
    return trigger.decide(step, PlanEvent(step, False, "none", False, ""), PLAN, m, judge=judge)


def test_a_borrow_the_judge_refuses_is_held_and_the_refusal_stands_for_the_dwell() -> None:
    asked: list[int] = []

    def refuse(replicas: int) -> bool:
        asked.append(replicas)
        return False

    trigger = ElasticTrigger(POOL)
    sig = _borrow_step(trigger, 1, refuse)
    assert (sig.action, sig.desired_replicas, sig.reason) == (
        "hold", 0, "borrow_not_predicted_to_pay")
    assert asked == [3]
    sig = _borrow_step(trigger, 2, refuse)
    assert (sig.action, sig.reason) == ("hold", "dwell") and asked == [3]
    sig = _borrow_step(trigger, 4, lambda replicas: True)  # dwell over; the judge agrees
    assert (sig.action, sig.desired_replicas, sig.reason) == ("join", 3, "borrow")


def test_planner_judges_a_borrow_by_the_search_scores() -> None:
    """A search whose scores favour the plan in force refuses the lend. Both plans are
    handed to the search at once first (one wave on the twin's workers, session 19)."""

    class Scores:
        cluster = SHAPE
        space = SearchSpace()

        def __init__(self, lent_s: float) -> None:
            self.lent_s = lent_s
            self.calls: list[tuple] = []

        def score(self, plan, work, tf=1.0, rf=1.0, greedy=True):
            self.calls.append(("score", plan.key()))
            return Scored(plan, 10.0, 100.0 if plan.key() == PLAN.key() else self.lent_s)

        def search(self, work, tf=1.0, rf=1.0, *, homogeneous_only=False, prefetch=()):
            return None

        def prefetch(self, plans, work) -> None:
            self.calls.append(("prefetch", *(p.key() for p in plans)))

        def train_s(self, par, work, extra=0) -> float:
            return 10.0

    config = PlannerConfig(pipeline_depth=5, elastic_span_alpha=0.5, elastic_dwell_steps=3,
                           warmup_steps=0, min_history_size=1, plan_interval_steps=100,
                           calibrate=False, elastic_borrow_judged=True, min_gain_ratio=0.15)
    for lent_s, action in ((90.0, "hold"), (80.0, "join")):
        scores = Scores(lent_s)
        planner = GlobalResourcePlanner(scores, config, current=PLAN)  # type: ignore[arg-type]
        planner.observe(StepMetrics(step=1, rollout_s=100.0, train_s=100.0,
                                    rollout_span_s=250.0, requests=HISTORY[:4]))
        assert planner.decide(1).elastic.action == action, lent_s
        prefetched = scores.calls[0]
        assert prefetched[:2] == ("prefetch", PLAN.key()) and len(prefetched) == 3
        assert scores.calls[1:] == [("score", PLAN.key()), ("score", prefetched[2])]


def test_libras_preflight_adopts_one_tp_degree_where_session_15s_adopted_a_mix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """r2e seed 0 (a tuning seed): session 15's preflight (any layout, the real twin with
    its session-15 options: its drain measured, prompts repeated) adopted a mix at
    16:32; libra's adopts uniform TP8."""
    trace = generate(GeneratorConfig(shape="r2e", num_steps=2, prompts_per_step=16, seed=0))
    libra = system("libra")
    plan = sim_run.initial_plan(SPEC, trace, libra)[0]
    assert _one_tp(plan) and set(plan.rollout_tps) == {8}
    old = replace(libra, planner_config=replace(
        libra.planner_config, preflight_layouts="any", elastic_borrow_judged=False))
    monkeypatch.setattr(sim_run, "TwinRefiner", functools.partial(
        TwinRefiner, window="after_fill", fresh_prompts=False))
    # Session 15 refined every mix (session 17 refines only those clearly ahead).
    monkeypatch.setattr(sim_run, "SearchSpace", functools.partial(
        SearchSpace, mix_refine_margin=None))
    plan = sim_run.initial_plan(SPEC, trace, old)[0]
    assert not _one_tp(plan) and plan.train_gpus == 16
