"""TrainerCore: start, batching and filtering, steps and versions, reports through a
coordinator outage. In-memory store, fake backend and coordinator (trainer_rig.py)."""
# ruff: noqa: F811 - the imported ``rig`` fixture is a parameter of every test

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from libra import types as t
from libra.errors import FailedPrecondition, NotFound
from libra.retry import RetryPolicy
from tests.unit.trainer.trainer_rig import (  # noqa: F401 - the rig fixture
    JOB,
    Rig,
    make_group,
    make_trajectory,
    rig,
)
from tests.waiting import wait_until

# -- start ---------------------------------------------------------------------------------

async def test_version_zero_is_published_before_any_training(rig: Rig) -> None:
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: rig.policy() is not None)
    policy = rig.policy()
    assert policy is not None and policy.version == 0
    assert policy.sha256 == hashlib.sha256(Path(policy.weights_path).read_bytes()).hexdigest()
    assert policy.model_dir == str(rig.tmp / "model")
    assert rig.backend.warm_started == 1 and rig.backend.steps == []


async def test_start_job_while_busy_is_a_failed_precondition(rig: Rig) -> None:
    core = rig.new_core()
    await core.start_job(JOB)
    with pytest.raises(FailedPrecondition):
        await core.start_job(JOB)


async def test_start_job_of_an_unknown_job_is_not_found(rig: Rig) -> None:
    with pytest.raises(NotFound):
        await rig.new_core().start_job("no-such-job")


# -- batching and filtering ------------------------------------------------------------------

async def test_only_complete_groups_are_trained(rig: Rig) -> None:
    await rig.write(make_trajectory(0, 0), *make_group(1))
    await rig.run_job()
    assert rig.backend.trained_ids == ["tr-1-0", "tr-1-1"]
    assert await rig.pending() == 1  # the lone member waits for its group


async def test_samples_carry_group_advantages(rig: Rig) -> None:
    await rig.write(*make_group(0, rewards=(1.0, 0.0)))
    await rig.run_job()
    (step,) = rig.backend.steps
    assert [round(s.advantage, 4) for s in step] == [1.0, -1.0]
    assert step[0].token_ids == [1, 20, 4, 13, 8] and step[0].loss_mask == [0, 0, 1, 1, 0]


async def test_stale_trajectory_drops_its_whole_group_once(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, max_staleness=0)
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: core.policy_version == 1)
    await rig.write(make_trajectory(1, 0, version=0), make_trajectory(1, 1, version=1),
                    *make_group(2, version=1))
    await rig.run_job(core)
    assert rig.backend.trained_ids == ["tr-0-0", "tr-0-1", "tr-2-0", "tr-2-1"]
    c = await rig.counters()
    assert (c["dropped_stale"], c["dropped_groups"]) == (2, 1)


async def test_member_gone_stale_while_its_group_filled_is_not_trained(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, max_staleness=0)
    await rig.write(*make_group(0), make_trajectory(1, 0, version=0))  # read at version 0
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: core.policy_version == 1)
    await rig.write(make_trajectory(1, 1, version=1), *make_group(2, version=1))
    await rig.run_job(core)
    assert rig.backend.trained_ids == ["tr-0-0", "tr-0-1", "tr-2-0", "tr-2-1"]
    c = await rig.counters()
    assert (c["dropped_stale"], c["dropped_groups"]) == (2, 1)


async def test_failed_trajectory_breaks_its_group(rig: Rig) -> None:
    failed = make_trajectory(0, 0, status=t.TrajectoryStatus.FAILED)
    await rig.write(failed, make_trajectory(0, 1), *make_group(1))
    await rig.run_job()
    assert rig.backend.trained_ids == ["tr-1-0", "tr-1-1"]
    c = await rig.counters()
    assert (c["dropped_failed"], c["dropped_groups"]) == (2, 1)


async def test_misaligned_trajectory_is_rejected_with_a_reason(
        rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    bad = make_trajectory(0, 0)
    bad.logprobs = bad.logprobs[:-1]
    await rig.write(bad, make_trajectory(0, 1), *make_group(1))
    with caplog.at_level(logging.WARNING, logger="services.trainer.core"):
        await rig.run_job()
    assert rig.backend.trained_ids == ["tr-1-0", "tr-1-1"]
    assert (await rig.counters())["dropped_failed"] == 2
    assert any("tr-0-0" in m and "logprobs has 4 entries" in m for m in caplog.messages)


async def test_duplicate_in_one_read_is_trained_once_and_acked(rig: Rig) -> None:
    a, b = make_group(0)
    await rig.write(a, a, b)
    await rig.run_job()
    assert rig.backend.trained_ids == ["tr-0-0", "tr-0-1"]
    assert await rig.pending() == 0


async def test_duplicate_after_training_is_acked_not_trained(rig: Rig) -> None:
    await rig.set_spec(num_steps=2)
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: len(rig.coordinator.steps) == 1)
    await rig.write(make_trajectory(0, 0), *make_group(1))
    await rig.run_job(core)
    assert rig.backend.trained_ids == ["tr-0-0", "tr-0-1", "tr-1-0", "tr-1-1"]
    assert await rig.pending() == 0


async def test_everything_produced_is_trained_or_dropped(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, max_staleness=0)
    bad = make_trajectory(1, 1)
    bad.token_versions = bad.token_versions[:2]
    await rig.write(*make_group(0), make_trajectory(1, 0), bad,
                    make_trajectory(2, 0, status=t.TrajectoryStatus.FAILED),
                    make_trajectory(2, 1), make_trajectory(3, 0, version=0))
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: core.policy_version == 1)
    await rig.write(make_trajectory(3, 1, version=1), *make_group(4, version=1))
    await rig.run_job(core)
    c = await rig.counters()
    assert c["produced"] == c["trained"] + c["dropped_stale"] + c["dropped_failed"] == 10
    assert (c["trained"], c["dropped_failed"], c["dropped_stale"]) == (4, 4, 2)
    assert await rig.pending() == 0


async def test_a_split_episode_trains_each_sequence_and_counts_as_one_trajectory(
        rig: Rig) -> None:
    """An external agent's episode split by a rewritten history: its earlier segment is
    a sequence of its own (same group, same advantage); the accounting counts episodes."""
    split, other = make_group(0, rewards=(1.0, 0.0))
    split.segments = [t.Segment([1, 30, 31], 1, [0, 1, 1], [0.0, -0.5, -0.5], [-1, 0, 0])]
    await rig.write(split, other)
    await rig.run_job()
    (step,) = rig.backend.steps
    assert [(s.trajectory_id, s.token_ids[:2], round(s.advantage, 4)) for s in step] == [
        ("tr-0-0", [1, 30], 1.0), ("tr-0-0", [1, 20], 1.0), ("tr-0-1", [1, 20], -1.0)]
    c = await rig.counters()
    assert c["produced"] == c["trained"] == 2
    ((_, record),) = rig.coordinator.steps
    assert (record["num_trajectories"], record["num_sequences"]) == (2, 3)


# -- steps, versions, job end --------------------------------------------------------------

async def test_versions_advance_every_sync_interval(rig: Rig) -> None:
    await rig.set_spec(num_steps=4, sync_interval=2, max_staleness=4)
    await rig.write(*[tr for g in range(4) for tr in make_group(g)])
    await rig.run_job()
    assert [rec["policy_version"] for _, rec in rig.coordinator.steps] == [0, 1, 1, 2]
    assert await rig.store.policy_version(JOB) == 2
    assert len(rig.backend.saved) == 3


async def test_each_step_is_reported_with_its_reward_mean(rig: Rig) -> None:
    await rig.set_spec(num_steps=2)
    await rig.write(*make_group(0, rewards=(1.0, 0.0)), *make_group(1, rewards=(1.0, 1.0)))
    await rig.run_job()
    assert [(job, rec["step"], rec["reward_mean"], rec["num_trajectories"])
            for job, rec in rig.coordinator.steps] == [(JOB, 1, 0.5, 2), (JOB, 2, 1.0, 2)]
    assert rig.coordinator.steps[0][1]["loss"] == 0.25


async def test_job_is_reported_succeeded_after_num_steps(rig: Rig) -> None:
    await rig.set_spec(num_steps=2)
    await rig.write(*make_group(0), *make_group(1))
    core = await rig.run_job()
    assert rig.coordinator.done == [(JOB, t.JobState.SUCCEEDED, "trained 2 steps")]
    assert (core.phase, core.step) == ("done", 2)


async def test_backend_error_reports_the_job_failed(rig: Rig) -> None:
    rig.backend.fail_with = RuntimeError("out of memory")
    await rig.write(*make_group(0))
    core = await rig.run_job()
    ((job, state, message),) = rig.coordinator.done
    assert (job, state, core.phase) == (JOB, t.JobState.FAILED, "failed")
    assert "out of memory" in message


# -- coordinator outage --------------------------------------------------------------------


async def test_an_unavailable_coordinator_delays_the_step_report_and_fails_nothing(
        rig: Rig) -> None:
    # The coordinator is restarting: its first 5 answers are UNAVAILABLE.
    rig.coordinator.unavailable_times = 5
    await rig.set_spec(num_steps=2)
    await rig.write(*make_group(0), *make_group(1))
    core = await rig.run_job()
    assert [rec["step"] for _, rec in rig.coordinator.steps] == [1, 2]  # each once
    assert rig.coordinator.done == [(JOB, t.JobState.SUCCEEDED, "trained 2 steps")]
    assert core.phase == "done"
    assert rig.sleep is not None and rig.sleep.delays_s == [0.1, 0.2, 0.4, 0.8, 1.6]


async def test_a_step_applied_whose_reply_was_lost_is_stored_once(rig: Rig) -> None:
    rig.coordinator.lose_reply_times = 1  # stored, then the coordinator died
    await rig.write(*make_group(0))
    await rig.run_job()
    assert [rec["step"] for _, rec in rig.coordinator.steps] == [1]
    assert rig.coordinator.num_repeats == 1  # the retry was recognised, not stored
    assert rig.coordinator.done[0][1] is t.JobState.SUCCEEDED


async def test_the_job_done_report_is_retried_until_the_coordinator_takes_it(
        rig: Rig) -> None:
    rig.coordinator.lose_reply_times = 1  # step 1 is fine; see below
    await rig.set_spec(num_steps=1)
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: rig.coordinator.steps)
    rig.coordinator.unavailable_times = 3  # down while the job ends
    await rig.run_job(core)
    assert rig.coordinator.done == [(JOB, t.JobState.SUCCEEDED, "trained 1 steps")]


async def test_a_coordinator_away_past_the_retry_budget_fails_the_job_with_a_reason(
        rig: Rig) -> None:
    rig.coordinator.unavailable_times = 10**6
    await rig.write(*make_group(0))
    core = rig.new_core(report_retry=RetryPolicy(give_up_after_s=30.0))
    await core.start_job(JOB)
    await rig.run_job(core)
    status = core.status()
    assert (status.job_id, status.phase) == (JOB, "failed")
    assert "coordinator restarting" in status.message  # read by the reconciliation
    assert rig.coordinator.done == [] and rig.coordinator.steps == []
    # Two reports (the step, then the failure) of at most budget + one capped backoff.
    assert rig.sleep is not None and sum(rig.sleep.delays_s) <= 2 * (30.0 + 2.0)
