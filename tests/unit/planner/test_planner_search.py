"""Search: bad search spaces and clusters fail clearly; the fast paths (pruning, batched
layout scoring, cached cost model) pick exactly what the plain enumeration picks."""

from __future__ import annotations

import math

import pytest

from scheduling.planner import (
    ClusterShape,
    PlanError,
    PlanSearch,
    RequestStats,
    RolloutCostModel,
    Scored,
    SearchSpace,
    Workload,
)
from scheduling.planner.search import REFINE_TOP_K
from tests.unit.planner.test_planner_core import HW, MODEL

HISTORY = tuple(
    RequestStats(300 + 37 * i % 900, 500 + (i * 7919) % 12000, 0.5 * (i % 5)) for i in range(200)
)


@pytest.mark.parametrize(
    ("shape", "space", "field"),
    [
        (ClusterShape(4, 8), SearchSpace(min_train_nodes=0), "min_train_nodes"),
        (ClusterShape(4, 8), SearchSpace(min_rollout_nodes=0), "min_rollout_nodes"),
        (ClusterShape(4, 8), SearchSpace(train_tp=3), "replica size 3"),
        (ClusterShape(2, 8), SearchSpace(train_tp=8, train_pp=3), "whole 24-device replicas"),
        (ClusterShape(4, 8), SearchSpace(fixed_train_nodes=4), "fixed_train_nodes"),
        (ClusterShape(4, 8), SearchSpace(node_patterns=((4, 2),)), "node_patterns"),
    ],
)
def test_bad_search_space_is_a_plan_error_naming_the_field(
    shape: ClusterShape, space: SearchSpace, field: str
) -> None:
    with pytest.raises(PlanError, match=field):
        PlanSearch(HW, MODEL, shape, space)


@pytest.mark.parametrize(("nodes", "gpus"), [(0, 8), (4, 0)])
def test_empty_cluster_is_a_plan_error(nodes: int, gpus: int) -> None:
    with pytest.raises(PlanError, match="cluster"):
        ClusterShape(nodes, gpus)


def test_replica_wider_than_a_node_only_uses_whole_replicas() -> None:
    # TP8 x PP2 = 16 devices = 2 nodes per replica: odd train node counts are skipped.
    search = PlanSearch(HW, MODEL, ClusterShape(6, 8), SearchSpace(train_pp=2))
    assert search._train_node_options() == [2, 4]
    best = search.search(Workload(32, HISTORY, 2))
    assert best is not None
    best.plan.validate(search.cluster)


def _brute_top_k(search: PlanSearch, work: Workload, tf: float, rf: float) -> list[Scored]:
    """The unpruned enumeration, one fast_makespan_s per layout."""
    model = RolloutCostModel(search.hw, search.model, work.history)
    scale = work.requests_per_step / len(work.history)
    rows = []
    for train_nodes in search._train_node_options():
        par = search.train_parallelism(train_nodes)
        t_train = search.train_s(par, work) * tf
        if math.isinf(t_train):
            continue
        best_t, best_layout = math.inf, ()
        for layout in search.layouts(search.cluster.num_nodes - train_nodes):
            counts: dict[int, int] = {}
            for pattern, n in layout:
                for tp in pattern:
                    counts[tp] = counts.get(tp, 0) + n
            t = model.fast_makespan_s(counts, scale, work.pipeline_depth)
            if t < best_t:
                best_t, best_layout = t, layout
        if best_layout:
            rows.append((max(t_train, best_t * rf), train_nodes, t_train, best_t * rf, best_layout))
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows[:REFINE_TOP_K]


@pytest.mark.parametrize(
    ("nodes", "requests", "depth", "tf", "rf"),
    [(6, 32, 1, 1.0, 1.0), (12, 256, 5, 3.0, 0.5), (20, 1024, 2, 0.2, 4.0)],
)
def test_pruned_search_equals_brute_force(
    nodes: int, requests: int, depth: int, tf: float, rf: float
) -> None:
    search = PlanSearch(HW, MODEL, ClusterShape(nodes, 8), SearchSpace())
    work = Workload(requests, HISTORY, depth)
    fast = search._closed_form_top_k(search.cost_model(work), work, tf, rf)
    brute = _brute_top_k(search, work, tf, rf)
    assert [(s.train_s, s.rollout_s, s.plan.train_gpus) for s in fast] == [
        (r[2], r[3], r[1] * 8) for r in brute
    ]
    layouts = [tuple(p for p, n in r[4] for _ in range(n)) for r in brute]
    assert [s.plan.rollout_nodes for s in fast] == layouts


def test_cost_model_is_reused_while_the_history_object_is_the_same() -> None:
    search = PlanSearch(HW, MODEL, ClusterShape(4, 8), SearchSpace())
    work = Workload(32, HISTORY, 1)
    assert search.cost_model(work) is search.cost_model(Workload(64, HISTORY, 2))
    assert search.cost_model(work) is not search.cost_model(Workload(32, HISTORY[:-1], 1))


def test_greedy_makespan_matches_a_hand_computed_case() -> None:
    model = RolloutCostModel(HW, MODEL, [RequestStats(100, 1000)] * 4)
    one = model.makespan_s([1], pipeline_depth=1)
    prof = model.profile(1, 4)
    work = 100 * prof.prefill_s_per_token + 1000 * prof.decode_step_s / prof.steady_batch
    latency = 100 * prof.prefill_s_per_token + 1000 * prof.decode_step_s
    assert one == pytest.approx(max(4 * work, latency))
