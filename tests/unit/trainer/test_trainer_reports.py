"""CoordinatorReporter: the trainer's step and job-done reports, retried and keyed.

Fakes: ``FakeCoordinator`` (tests/fakes/coordinator.py) replaces the coordinator client
and keys step records by their idempotency key as the coordinator does; ``FakeClock`` +
``FakeSleep`` replace wall time and waiting.
"""

from __future__ import annotations

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.errors import Unavailable
from libra.retry import RetryPolicy
from services.trainer.reports import CoordinatorReporter
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.sleep import FakeSleep


def make_reporter(coordinator: FakeCoordinator,
                  give_up_after_s: float = 600.0) -> tuple[CoordinatorReporter, FakeSleep]:
    clock = FakeClock()
    sleep = FakeSleep(clock)
    policy = RetryPolicy(give_up_after_s=give_up_after_s)
    return CoordinatorReporter(coordinator, clock, policy, sleep), sleep


async def test_a_step_report_is_retried_until_stored_exactly_once() -> None:
    coordinator = FakeCoordinator(unavailable_times=3, lose_reply_times=1)
    reporter, sleep = make_reporter(coordinator)
    await reporter.report_step("j", t.StepRecord(step=4, reward_mean=0.5))
    assert coordinator.steps == [("j", {"step": 4, "reward_mean": 0.5})]
    assert coordinator.num_repeats == 1
    assert len(sleep.delays_s) == 4


def test_the_key_names_job_step_and_run_and_a_new_run_changes_it() -> None:
    reporter, _ = make_reporter(FakeCoordinator())
    first = reporter.step_key("j", 3)
    assert first == reporter.step_key("j", 3) and first.startswith("j:3:")
    reporter.new_run()
    assert reporter.step_key("j", 3) != first


async def test_a_step_redone_in_a_new_run_is_stored_again() -> None:
    coordinator = FakeCoordinator()
    reporter, _ = make_reporter(coordinator)
    await reporter.report_step("j", t.StepRecord(step=1))
    reporter.new_run()  # the trainer resumed from a checkpoint before step 1
    await reporter.report_step("j", t.StepRecord(step=1))
    assert len(coordinator.steps) == 2 and coordinator.num_repeats == 0


async def test_a_step_report_past_the_budget_raises_the_last_error() -> None:
    reporter, _ = make_reporter(FakeCoordinator(unavailable_times=10**6), give_up_after_s=5.0)
    with pytest.raises(Unavailable):
        await reporter.report_step("j", t.StepRecord(step=1))


async def test_a_job_done_report_is_retried_and_says_it_was_delivered() -> None:
    coordinator = FakeCoordinator(unavailable_times=2)
    reporter, _ = make_reporter(coordinator)
    assert await reporter.report_job_done("j", t.JobState.SUCCEEDED, "trained 3 steps")
    assert coordinator.done == [("j", t.JobState.SUCCEEDED, "trained 3 steps")]


async def test_a_job_done_report_that_cannot_be_delivered_returns_false() -> None:
    reporter, _ = make_reporter(FakeCoordinator(unavailable_times=10**6), give_up_after_s=5.0)
    assert not await reporter.report_job_done("j", t.JobState.FAILED, "boom")
