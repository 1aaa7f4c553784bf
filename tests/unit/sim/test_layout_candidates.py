"""Libra's layout is a plan variable (issue 20, session 14 lever 3): the twin judges a
homogeneous layout at each split the closed form ranks top, and C-MLFQ on one bucket
routes by load, as least-loaded does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.planner import (
    ClusterShape,
    PlanError,
    PlanSearch,
    RequestStats,
    SearchSpace,
    Workload,
    pipeline_depth,
)
from sim.generators import GeneratorConfig, generate
from sim.presets import cluster
from sim.run import run
from sim.systems import LIBRA_PATTERNS, system

SPEC = cluster("a800x48")
TRACE = generate(GeneratorConfig(shape="math", num_steps=6, prompts_per_step=8, seed=7))


class _Refiner:
    """Scores every plan alike and records which plans it was asked about."""

    def __init__(self) -> None:
        self.asked: list = []

    def rollout_s(self, plan, work) -> float:
        self.asked.append(plan)
        return 1.0


def _search(**space: object) -> tuple[PlanSearch, _Refiner, Workload]:
    refiner = _Refiner()
    search = PlanSearch(
        SPEC.hardware, SPEC.model, ClusterShape(SPEC.num_nodes, 8),
        SearchSpace(node_patterns=LIBRA_PATTERNS, train_tp=8, **space), refiner=refiner,
    )
    history = tuple(RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s) for t in TRACE)
    return search, refiner, Workload(64, history, pipeline_depth(4))


def _homogeneous(plan) -> bool:
    return len({tp for node in plan.rollout_nodes for tp in node}) == 1


def test_each_top_split_gets_its_best_homogeneous_layout_judged() -> None:
    search, _, work = _search()
    model = search.cost_model(work)
    top = search._closed_form_top_k(model, work, 1.0, 1.0)
    extra = search._homogeneous_per_split(model, work, top)
    splits = {c.plan.train_gpus for c in top}
    assert extra and all(_homogeneous(c.plan) for c in extra)
    assert {c.plan.train_gpus for c in extra} <= splits
    assert len({c.plan.key() for c in top + extra}) == len(top) + len(extra)  # no repeats


def _front_terms(search: PlanSearch, model, work: Workload, train_gpus: int, tp: int):
    nodes_left = search.cluster.num_nodes - train_gpus // 8
    scale = work.requests_per_step / len(work.history)
    count = (8 // tp) * nodes_left
    return (model.work_term_s({tp: count}, scale, work.pipeline_depth), model.unloaded_path_s(tp))


def test_the_front_screen_keeps_every_undominated_homogeneous_layout() -> None:
    # Session 15: the closed form ranks TP4 ahead of TP8 at every top split, the twin
    # and the simulation TP8; the screen keeps both the throughput and the straggler end.
    search, _, work = _search(homogeneous_screen="front")
    model = search.cost_model(work)
    top = search._closed_form_top_k(model, work, 1.0, 1.0)
    extra = search._homogeneous_per_split(model, work, top)
    homogeneous = [p for p in LIBRA_PATTERNS if len(set(p)) == 1]
    for split in {c.plan.train_gpus for c in top}:
        kept = {c.plan.rollout_nodes[0][0] for c in extra + top
                if c.plan.train_gpus == split and _homogeneous(c.plan)}
        terms = {p[0]: _front_terms(search, model, work, split, p[0]) for p in homogeneous}
        assert 8 in kept  # the shortest straggler path is always on the front
        for tp, (w, path) in terms.items():
            dominated = any(w2 <= w and p2 <= path and (w2, p2) != (w, path)
                            for w2, p2 in terms.values())
            assert (tp in kept) or dominated, (split, tp)
    assert len({c.plan.key() for c in top + extra}) == len(top) + len(extra)


def test_the_closed_form_screen_judges_one_per_split() -> None:
    search, _, work = _search(homogeneous_screen="closed_form")
    model = search.cost_model(work)
    top = search._closed_form_top_k(model, work, 1.0, 1.0)
    extra = search._homogeneous_per_split(model, work, top)
    assert len({c.plan.train_gpus for c in extra}) == len(extra)
    front, _, _ = _search(homogeneous_screen="front")
    assert len(front._homogeneous_per_split(model, work, top)) > len(extra)


def test_the_unloaded_path_falls_with_tp() -> None:
    search, _, work = _search()
    model = search.cost_model(work)
    paths = [model.unloaded_path_s(tp) for tp in (1, 2, 4, 8)]
    assert paths == sorted(paths, reverse=True) and paths[-1] < paths[0]


@pytest.mark.parametrize("value", ["all", "", None, 1])
def test_an_unknown_screen_names_the_field(value: object) -> None:
    with pytest.raises(PlanError, match="homogeneous_screen"):
        _search(homogeneous_screen=value)


def test_heterogeneity_required_adds_none() -> None:
    search, _, work = _search(require_heterogeneous=True)
    model = search.cost_model(work)
    top = search._closed_form_top_k(model, work, 1.0, 1.0)
    assert search._homogeneous_per_split(model, work, top) == []


def test_the_option_off_is_not_consulted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    for value in (False, True):
        search, _, work = _search(homogeneous_per_split=value)
        monkeypatch.setattr(search, "_homogeneous_per_split",
                            lambda *a, v=value: calls.append(v) or [])
        search.search(work)
    assert calls == [True]


@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_non_bool_option_names_the_field(value: object) -> None:
    with pytest.raises(PlanError, match="homogeneous_per_split"):
        _search(homogeneous_per_split=value)


@pytest.mark.parametrize("pattern", [(8,), (2, 2, 2, 2)])
def test_cmlfq_on_one_bucket_routes_as_least_loaded(pattern: tuple[int, ...]) -> None:
    lb = system("stream-lb").with_split(24, pattern, "test")
    cm = replace(lb, policy="cmlfq", policy_config=system("libra").policy_config)
    a, b = run(SPEC, TRACE, lb), run(SPEC, TRACE, cm)
    assert b["migrations"] == 0
    assert b["throughput_traj_per_s"] == pytest.approx(a["throughput_traj_per_s"], rel=0.02)


def _mixes(plans) -> list:
    return [p for p in plans if not _homogeneous(p)]


def test_mixes_inside_the_margin_are_not_refined() -> None:
    # Session 17: the closed form puts its top splits' mixes a few percent ahead of the
    # homogeneous layouts there; inside the twin's 15% band they are not judged.
    screened, refiner, work = _search()
    everything, every_refiner, _ = _search(mix_refine_margin=None)
    model = screened.cost_model(work)
    kept = screened.candidates(model, work)
    assert _mixes(c.plan for c in everything.candidates(model, work))
    assert not _mixes(c.plan for c in kept)
    screened.search(work)
    everything.search(work)
    assert not _mixes(refiner.asked) and _mixes(every_refiner.asked)


def test_a_mix_clearly_ahead_is_refined() -> None:
    from scheduling.planner import candidates as cands
    from scheduling.planner.scored import Scored

    search, _, work = _search(mix_refine_margin=None)
    model = search.cost_model(work)
    found = search.candidates(model, work)
    mix = next(c for c in found if not _homogeneous(c.plan))
    same_split = [c for c in found if _homogeneous(c.plan)
                  and c.plan.train_gpus == mix.plan.train_gpus]
    best = min(c.objective_s for c in same_split)
    ahead = Scored(mix.plan, 0.0, best * 0.8)  # 20% ahead by the closed form
    behind = Scored(mix.plan, 0.0, best * 0.9)  # 10% ahead: inside a 15% margin
    assert cands.screen_mixes([*same_split, ahead], 0.15)[-1] is ahead
    assert behind not in cands.screen_mixes([*same_split, behind], 0.15)
    assert cands.screen_mixes([behind], 0.15) == [behind]  # nothing else at its split


def test_a_margin_of_zero_drops_only_mixes_not_ahead() -> None:
    search, _, work = _search(mix_refine_margin=0.0)
    model = search.cost_model(work)
    found = search.candidates(model, work)
    for c in found:
        if not _homogeneous(c.plan):
            rivals = [h.objective_s for h in found
                      if _homogeneous(h.plan) and h.plan.train_gpus == c.plan.train_gpus]
            assert all(c.objective_s < r for r in rivals)


@pytest.mark.parametrize("value", [-0.1, 1.0, 2, "0.15", True, float("nan")])
def test_a_bad_mix_margin_names_the_field(value: object) -> None:
    with pytest.raises(PlanError, match="mix_refine_margin"):
        _search(mix_refine_margin=value)


def test_mixes_are_kept_where_heterogeneity_is_required() -> None:
    # A space that asks for mixes gets every one judged (the uniform guard may still be
    # homogeneous: it is not screened by the space).
    search, _, work = _search(require_heterogeneous=True)
    model = search.cost_model(work)
    found = search.candidates(model, work)
    assert _mixes(c.plan for c in found)
    everything, _, _ = _search(require_heterogeneous=True, mix_refine_margin=None)
    assert [c.plan.key() for c in found] == [
        c.plan.key() for c in everything.candidates(model, work)]
