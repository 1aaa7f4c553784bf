"""The elastic trigger (issue 20 item 5, fourth bullet): a smoothed rollout-span
estimate over the pipeline depth, and a dwell between changes of the pool."""

from __future__ import annotations

import pytest

from scheduling.planner import Plan, PlanEvent, PlannerConfig, StepMetrics
from scheduling.planner import TrainParallelism as TP
from scheduling.planner.elastic_trigger import ElasticTrigger

PLAN = Plan(TP(8, 1, 2), ((2, 2, 2, 2),) * 4)  # 32 rollout GPUs, reserve 8 -> 3 replicas
CONFIG = PlannerConfig(pipeline_depth=5, elastic_span_alpha=0.5, elastic_dwell_steps=3)


def _metrics(step: int, train_s: float, span_s: float | None, hybrids: int = 0,
             rollout_s: float = 100.0, pressure: float = 0.0) -> StepMetrics:
    return StepMetrics(step=step, rollout_s=rollout_s, train_s=train_s,
                       rollout_span_s=span_s, hybrid_active=hybrids, queue_pressure=pressure)


def _decide(trigger: ElasticTrigger, m: StepMetrics):
    trigger.observe(m)
    return trigger.decide(m.step, PlanEvent(m.step, False, "none", False, ""), PLAN, m)


def test_ratio_reads_the_smoothed_span_over_the_depth_not_the_gap() -> None:
    trigger = ElasticTrigger(CONFIG)
    # Inter-completion gap 5 s (a burst) would say "borrow"; the span says rollout
    # takes 250 / 5 = 50 s per step against 30 s of training: release.
    sig = _decide(trigger, _metrics(1, train_s=30.0, span_s=250.0, rollout_s=5.0))
    assert trigger.span_ema_s == 250.0
    assert (sig.action, sig.reason) == ("hold", "release")
    _decide(trigger, _metrics(2, train_s=30.0, span_s=150.0))
    assert trigger.span_ema_s == pytest.approx(200.0)  # EMA, alpha 0.5
    assert trigger.rollout_estimate_s(_metrics(2, 30.0, None)) == pytest.approx(40.0)


def test_without_span_or_smoothing_the_step_rollout_s_is_read() -> None:
    trigger = ElasticTrigger(PlannerConfig(pipeline_depth=5))  # alpha 0: off
    sig = _decide(trigger, _metrics(1, train_s=30.0, span_s=250.0, rollout_s=5.0))
    assert trigger.span_ema_s is None
    assert (sig.action, sig.desired_replicas, sig.reason) == ("join", 3, "borrow")


def test_dwell_holds_a_change_and_lets_forced_releases_through() -> None:
    trigger = ElasticTrigger(CONFIG)
    sig = _decide(trigger, _metrics(1, train_s=100.0, span_s=250.0))  # 100 vs 50: borrow
    assert (sig.action, sig.desired_replicas) == ("join", 3)
    sig = _decide(trigger, _metrics(2, train_s=10.0, span_s=250.0, hybrids=3))
    assert (sig.action, sig.desired_replicas, sig.reason) == ("hold", 3, "dwell")
    sig = _decide(trigger, _metrics(3, train_s=10.0, span_s=250.0, hybrids=3, pressure=0.9))
    assert (sig.action, sig.desired_replicas, sig.reason) == ("release", 0, "rollout_pressure")
    sig = _decide(trigger, _metrics(4, train_s=100.0, span_s=250.0))
    assert (sig.action, sig.reason) == ("hold", "dwell")  # the forced release started a dwell
    sig = _decide(trigger, _metrics(6, train_s=100.0, span_s=250.0))
    assert (sig.action, sig.desired_replicas) == ("join", 3)


def test_bad_knobs_name_the_field() -> None:
    with pytest.raises(ValueError, match="elastic_span_alpha"):
        PlannerConfig(elastic_span_alpha=1.5)
    with pytest.raises(ValueError, match="elastic_dwell_steps"):
        PlannerConfig(elastic_dwell_steps=-1)
