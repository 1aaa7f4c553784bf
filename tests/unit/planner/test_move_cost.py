"""The ``migrated`` transition-cost model (issue 20, session 16): a move's weight load
and re-prefill, the terms the simulator's ``migrate`` strategies charge."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduling.planner import (
    ClusterShape,
    GlobalResourcePlanner,
    Plan,
    PlannerConfig,
    RequestStats,
    Scored,
    StepMetrics,
    TrainParallelism,
    Workload,
    prefill_s,
)
from scheduling.planner.move_cost import migrated_move_cost
from sim.presets import cluster

SPEC = cluster("a800x32")
HW, MODEL = SPEC.hardware, SPEC.model
CURRENT = Plan(TrainParallelism(8, 1, 1), ((8,), (8,), (8,)))
RELAID = Plan(TrainParallelism(8, 1, 1), ((8,), (4, 4), (4, 4)))
"""Two of three rollout nodes change pattern."""
HISTORY = (RequestStats(1_000, 2_000), RequestStats(1_000, 6_000))
WORK = Workload(16, HISTORY, 5)
BW = 2e9


def test_cost_is_the_share_s_weight_load_plus_its_re_prefill() -> None:
    cost = migrated_move_cost(CURRENT, RELAID, WORK, HW, MODEL, 8, BW, in_flight=30)
    assert cost.share == pytest.approx(2 / 3)
    # The smallest TP of the new layout (4) reads a quarter of the weights.
    assert cost.load_s == pytest.approx(2 / 3 * MODEL.num_params * 2 / 4 / BW)
    # Length-biased half output: (2000^2 + 6000^2) / (2 x 8000) = 2500 tokens.
    ctx = 1_000 + 2_500
    expected = 30 * (2 / 3) * prefill_s(HW, MODEL, 1, ctx) / 24
    assert cost.reprefill_s == pytest.approx(expected)
    assert cost.total_s == pytest.approx(cost.load_s + cost.reprefill_s)


def test_no_change_costs_nothing_and_a_full_pipeline_is_assumed_unmeasured() -> None:
    assert migrated_move_cost(CURRENT, CURRENT, WORK, HW, MODEL, 8, BW).total_s == 0.0
    unmeasured = migrated_move_cost(CURRENT, RELAID, WORK, HW, MODEL, 8, BW)
    full = migrated_move_cost(CURRENT, RELAID, WORK, HW, MODEL, 8, BW, in_flight=16 * 5)
    assert unmeasured == full
    no_bw = migrated_move_cost(CURRENT, RELAID, WORK, HW, MODEL, 8, 0.0, in_flight=30)
    assert no_bw.load_s == 0.0 and no_bw.reprefill_s > 0


@dataclass
class _Search:
    """Fixed scores (as ``PlanSearch`` would give) over the real hardware and model."""

    hw = HW
    model = MODEL
    cluster = ClusterShape(4, 8)

    def score(self, plan, work, tf=1.0, rf=1.0, greedy=True) -> Scored:
        return Scored(plan, 10.0, 100.0 if plan.key() == CURRENT.key() else 80.0)

    def search(self, work, tf=1.0, rf=1.0, *, homogeneous_only=False, prefetch=()) -> Scored:
        return Scored(RELAID, 10.0, 80.0)

    def train_s(self, par, work, extra=0) -> float:
        return 10.0


def test_the_planner_charges_the_migrated_cost_with_the_measured_in_flight_count() -> None:
    config = PlannerConfig(
        plan_interval_steps=10, warmup_steps=0, min_history_size=1, cooldown_steps=0,
        transition_cost_s=5.0, gain_horizon_steps=5, transition_cost_model="migrated",
        weight_load_bw_bytes_per_s=BW,
    )
    planner = GlobalResourcePlanner(_Search(), config, CURRENT)
    planner.observe(StepMetrics(
        step=10, rollout_s=100.0, train_s=10.0, requests=HISTORY, requests_per_step=16,
        in_flight_trajectories=30,
    ))
    event = planner.decide(10)
    move = migrated_move_cost(CURRENT, RELAID, Workload(16, HISTORY, 1), HW, MODEL, 8, BW, 30)
    assert event.transition_cost_s == pytest.approx(5.0 + move.total_s)
    # Cheaper than restarting the re-created share's work (``recreated``: 100 s x 2/3).
    assert move.total_s < 100.0 * 2 / 3
    assert event.applied


def test_a_negative_load_bandwidth_names_the_field() -> None:
    with pytest.raises(ValueError, match="weight_load_bw_bytes_per_s"):
        PlannerConfig(weight_load_bw_bytes_per_s=-1.0)
