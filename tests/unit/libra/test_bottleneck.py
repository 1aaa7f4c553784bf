"""The bottleneck verdict: each verdict from the idle ratios it is read from (pure)."""

from __future__ import annotations

import pytest

from libra.bottleneck import TOOL_SHARE_MIN, VERDICTS, WINDOW_STEPS, bottleneck
from libra.types import StepRecord


def step(n: int, *, rollout_s: float = 0.0, train_s: float = 0.0, publish_s: float = 0.0,
         wall_s: float | None = None, **metrics: float) -> StepRecord:
    return StepRecord(step=n, rollout_s=rollout_s, train_s=train_s, publish_s=publish_s,
                      wall_s=wall_s, metrics=dict(metrics))


def test_no_step_is_unknown() -> None:
    verdict = bottleneck([])
    assert (verdict.kind, verdict.num_steps) == ("unknown", 0)


def test_steps_without_phase_times_are_unknown() -> None:
    assert bottleneck([StepRecord(step=1, reward_mean=0.5)]).kind == "unknown"


def test_a_trainer_waiting_for_rollouts_is_rollout_bound() -> None:
    verdict = bottleneck([step(1, rollout_s=3.0, train_s=1.0, wall_s=4.0)])
    assert verdict.kind == "rollout-bound"
    assert (verdict.idle_share, verdict.train_share, verdict.tool_share) == (0.75, 0.25, None)
    assert verdict.line.startswith("rollout-bound: the trainer waits for rollouts")
    assert "trainer idle 75%" in verdict.line


def test_rollouts_waiting_on_tools_are_tool_bound() -> None:
    verdict = bottleneck([step(1, rollout_s=3.0, train_s=1.0, wall_s=4.0, tool_s=2.4)])
    assert verdict.kind == "tool-bound"
    assert verdict.tool_share == 0.6 and "tool waits 60%" in verdict.line


def test_few_tool_waits_leave_it_rollout_bound() -> None:
    tool_s = 4.0 * TOOL_SHARE_MIN - 0.4
    assert bottleneck([step(1, rollout_s=3.0, train_s=1.0, wall_s=4.0,
                            tool_s=tool_s)]).kind == "rollout-bound"


def test_a_busy_trainer_is_train_bound_and_recompute_counts_as_training() -> None:
    verdict = bottleneck([step(1, rollout_s=1.0, train_s=1.0, wall_s=3.5, recompute_s=1.5)])
    assert verdict.kind == "train-bound"
    assert verdict.train_share == round(2.5 / 3.5, 4)


def test_weight_sync_dominating_is_sync_bound_and_reload_counts_as_sync() -> None:
    verdict = bottleneck([step(1, rollout_s=0.5, train_s=0.5, publish_s=1.0, reload_s=1.0,
                               wall_s=3.0)])
    assert verdict.kind == "sync-bound"
    assert verdict.sync_share == round(2.0 / 3.0, 4)


def test_only_the_window_of_recent_steps_counts() -> None:
    """A job that turned train-bound is called so once the window holds the new regime."""
    old = [step(n, rollout_s=5.0, train_s=1.0, wall_s=6.0) for n in range(1, 21)]
    new = [step(n, rollout_s=0.5, train_s=5.0, wall_s=5.5)
           for n in range(21, 21 + WINDOW_STEPS)]
    assert bottleneck(old).kind == "rollout-bound"
    verdict = bottleneck(old + new)
    assert (verdict.kind, verdict.num_steps) == ("train-bound", WINDOW_STEPS)


def test_a_step_without_wall_time_is_measured_by_its_phases() -> None:
    verdict = bottleneck([step(1, rollout_s=1.0, train_s=3.0)])
    assert (verdict.kind, verdict.train_share) == ("train-bound", 0.75)


@pytest.mark.parametrize("kind", VERDICTS)
def test_every_verdict_is_named_in_its_line(kind: str) -> None:
    records = {
        "unknown": [],
        "rollout-bound": [step(1, rollout_s=2.0, train_s=1.0)],
        "tool-bound": [step(1, rollout_s=2.0, train_s=1.0, tool_s=3.0)],
        "train-bound": [step(1, rollout_s=1.0, train_s=2.0)],
        "sync-bound": [step(1, rollout_s=1.0, train_s=1.0, publish_s=2.0)],
    }[kind]
    verdict = bottleneck(records)
    assert verdict.kind == kind and verdict.line.startswith(kind + ":")
