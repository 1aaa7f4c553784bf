"""Planner core rules not covered in test_planner_core: every gate, trigger edges, the
net-gain rule one condition at a time, refusal of invalid candidates, elastic order."""

from __future__ import annotations

import pytest

from scheduling.planner import (
    GlobalResourcePlanner,
    Plan,
    PlanError,
    PlannerConfig,
    TrainParallelism,
)
from tests.unit.planner.test_planner_core import (
    CURRENT,
    OTHER,
    SHAPE,
    FakeSearch,
    _metrics,
    _planner,
)


def _decide(planner: GlobalResourcePlanner, step: int, **kw):
    planner.observe(_metrics(step, **kw))
    return planner.decide(step)


# Gates.


def test_online_disabled_never_fires() -> None:
    planner = _planner(enable_online=False)
    event = _decide(planner, 10, queue_pressure=1.0)
    assert (event.fired, event.reason) == (False, "online_disabled")


def test_min_history_gate_blocks_until_enough_records() -> None:
    planner = _planner(min_history_size=11)  # _planner seeds 10 records
    assert _decide(planner, 10).reason == "history_too_small"
    planner.add_history(list(planner._history)[:1])
    assert _decide(planner, 20).fired is True


def test_warmup_gate_opens_at_warmup_step() -> None:
    planner = _planner(warmup_steps=4)
    assert _decide(planner, 3, queue_pressure=1.0).reason == "warmup"
    assert _decide(planner, 4, queue_pressure=1.0).trigger == "queue_pressure"


def test_cooldown_blocks_exactly_cooldown_steps_after_an_applied_plan() -> None:
    planner = _planner(cooldown_steps=2)
    assert _decide(planner, 10).applied is True
    assert _decide(planner, 11, queue_pressure=1.0).reason == "cooldown"
    assert _decide(planner, 12, queue_pressure=1.0).reason == "cooldown"
    assert _decide(planner, 13, queue_pressure=1.0).fired is True


def test_cooldown_does_not_start_on_a_refused_plan() -> None:
    planner = _planner(cooldown_steps=5, transition_cost_s=1000.0)
    assert _decide(planner, 10).applied is False
    assert _decide(planner, 11, queue_pressure=1.0).fired is True


# Triggers at their thresholds.


def test_no_trigger_below_every_threshold() -> None:
    planner = _planner()
    event = _decide(
        planner, 3, queue_pressure=0.74, active_pressure=0.84, rejected_total=7,
        rollout_s=12.4, train_s=10.0,
    )
    assert (event.fired, event.reason) == (False, "no_trigger")


def test_rejected_growth_counts_since_the_last_check() -> None:
    planner = _planner()
    assert _decide(planner, 3, rejected_total=8).trigger == "rejected_growth"
    # Total unchanged: no growth since the last check, no trigger.
    assert _decide(planner, 4, rejected_total=8).fired is False
    assert _decide(planner, 5, rejected_total=15).fired is False
    assert _decide(planner, 6, rejected_total=23).trigger == "rejected_growth"


def test_interval_takes_precedence_over_pressure() -> None:
    planner = _planner()
    assert _decide(planner, 20, queue_pressure=1.0).trigger == "interval"


# Net-gain rule, one condition at a time.


def test_positive_raw_gain_with_negative_net_gain_is_not_applied() -> None:
    planner = _planner(search=FakeSearch(current_s=100.0, candidate_s=80.0), transition_cost_s=25.0)
    event = _decide(planner, 10)
    assert event.raw_gain_s == 20.0 and event.net_gain_s == -5.0
    assert (event.applied, event.reason, planner.current) == (
        False, "net_gain_not_positive", CURRENT
    )


def test_net_gain_exactly_zero_is_not_applied() -> None:
    planner = _planner(search=FakeSearch(current_s=100.0, candidate_s=85.0), transition_cost_s=15.0)
    assert _decide(planner, 10).reason == "net_gain_not_positive"


def test_gain_ratio_below_threshold_is_not_applied_even_with_positive_net() -> None:
    planner = _planner(
        search=FakeSearch(current_s=1000.0, candidate_s=960.0),
        transition_cost_s=1.0,
        min_gain_ratio=0.05,
    )
    event = _decide(planner, 10)
    assert event.net_gain_s == 39.0 and event.gain_ratio == pytest.approx(0.04)
    assert (event.applied, event.reason) == (False, "gain_ratio_below_threshold")


def test_invalid_candidate_is_refused_with_the_plan_error() -> None:
    bad = Plan(TrainParallelism(8, 1, 1), ((2, 2, 2, 2),))  # 8 + 8 != 32 devices
    planner = _planner(search=FakeSearch(candidate=bad, candidate_s=1.0))
    event = _decide(planner, 10)
    assert event.applied is False and event.reason.startswith("invalid_candidate: ")
    assert planner.current == CURRENT


def test_invalid_current_plan_is_a_clear_error() -> None:
    with pytest.raises(PlanError, match="rollout_nodes"):
        GlobalResourcePlanner(FakeSearch(), PlannerConfig(), Plan(TrainParallelism(8, 1, 4), ()))


@pytest.mark.parametrize(
    ("field", "value"),
    [("elastic_reserve_gpus", -1), ("transition_cost_s", -1.0), ("pipeline_depth", 0),
     ("plan_interval_steps", 0), ("elastic_release_ratio", 1.2)],
)
def test_config_rejects_bad_knobs(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PlannerConfig(**{field: value})


# Elastic signal order (digest 5.5).


def _elastic(planner: GlobalResourcePlanner, step: int, **kw):
    return _decide(planner, step, **kw).elastic


def test_elastic_rollout_pressure_releases_everything() -> None:
    planner = _planner(enable_online=False)
    signal = _elastic(planner, 1, train_s=30.0, hybrid_active=1, active_pressure=0.8)
    assert (signal.action, signal.desired_replicas, signal.reason) == (
        "release", 0, "rollout_pressure"
    )


def test_elastic_release_cancels_joins_in_flight() -> None:
    planner = _planner(enable_online=False)
    signal = _elastic(planner, 1, train_s=5.0, hybrid_joining=1)
    assert (signal.action, signal.current_replicas, signal.desired_replicas) == ("release", 1, 0)


def test_elastic_candidate_wanting_training_lends_the_difference() -> None:
    # CURRENT trains on 16 devices; the candidate on 24 (one 8-device replica more).
    bigger = Plan(TrainParallelism(8, 1, 3), ((2, 2, 2, 2),))
    planner = _planner(search=FakeSearch(candidate=bigger, candidate_s=99.0),
                       elastic_reserve_gpus=0)
    signal = _elastic(planner, 10, train_s=10.0)
    assert (signal.action, signal.desired_replicas, signal.reason) == (
        "join", 1, "candidate_wants_training"
    )


def test_elastic_capacity_override_caps_the_borrow() -> None:
    planner = _planner(enable_online=False, elastic_reserve_gpus=0)
    assert _elastic(planner, 1, train_s=30.0).desired_replicas == 2
    signal = _elastic(planner, 2, train_s=30.0, elastic_capacity_replicas=1)
    assert (signal.desired_replicas, signal.reason) == (1, "borrow")


def test_core_replan_off_keeps_the_plan_and_moves_the_pool() -> None:
    bigger = Plan(TrainParallelism(8, 1, 3), ((2, 2, 2, 2),))
    planner = _planner(search=FakeSearch(candidate=bigger, candidate_s=50.0),
                       core_replan=False, elastic_reserve_gpus=0, cooldown_steps=3)
    event = _decide(planner, 10, train_s=10.0)
    assert (event.applied, event.reason, planner.current) == (True, "applied_via_elastic", CURRENT)
    assert (event.elastic.desired_replicas, event.elastic.reason) == (1, "approved_plan")
    assert _decide(planner, 11, queue_pressure=1.0).reason == "cooldown"


def test_same_plan_reason_wins_over_gain() -> None:
    planner = _planner(search=FakeSearch(candidate=OTHER, candidate_s=1.0))
    planner.rebase(OTHER)
    assert _decide(planner, 10).reason == "same_plan"
    with pytest.raises(PlanError):
        planner.rebase(Plan(TrainParallelism(8, 1, 0), ((8,),) * 4))
    assert planner.current == OTHER and SHAPE.num_gpus == 32
