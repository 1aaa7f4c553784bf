"""CoordinatorCore: the trainer's reports, step records and the job's end (the job
lifecycle and worker leases are in test_coordinator_core.py).

Fakes: ``FakeRunner`` replaces the trainer and scheduler gRPC clients (it records calls
and can be told to refuse); ``FakeClock`` replaces wall time. The store is the real
``InMemoryCoordinatorStore`` and the job spec parser is real.
"""

from __future__ import annotations

import pytest

from libra import types as t
from libra.errors import InvalidArgument, Unavailable
from libra.limits import MAX_NUM_STEPS
from services.coordinator.store_protocol import StepAppend
from tests.fakes.runner import FakeRunner
from tests.unit.coordinator.test_coordinator_core import VALID_SPEC, make_core


async def test_report_step_updates_step_version_and_history() -> None:
    core, _, _, _, clock = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    clock.advance(1)
    await core.report_step(job.job_id, t.StepRecord(step=1, policy_version=1, reward_mean=0.5))
    await core.report_step(job.job_id, t.StepRecord(step=2, policy_version=2, reward_mean=0.7))
    got, steps, _counters = await core.get_job(job.job_id)
    assert (got.step, got.policy_version) == (2, 2)
    assert [s["reward_mean"] for s in steps] == [0.5, 0.7]
    assert got.updated_at_ms == clock.now_ms()


async def test_the_same_step_report_twice_keeps_one_record() -> None:
    # The trainer's retry after the coordinator stored the step and died before replying.
    core, store, *_ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    record = t.StepRecord(step=1, policy_version=1, reward_mean=0.5)
    assert await core.report_step(job.job_id, record, "k1") is StepAppend.STORED
    assert await core.report_step(job.job_id, record, "k1") is StepAppend.REPEAT
    assert await store.steps(job.job_id) == [{"step": 1, "policy_version": 1, "reward_mean": 0.5}]
    assert await store.events(job.job_id) == []


async def test_a_repeated_report_still_sets_the_job_step_and_version() -> None:
    # The first try stored the record but died before writing the job's fields.
    core, store, *_ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    await store.append_step(job.job_id, {"step": 1, "policy_version": 1}, "k1")
    await core.report_step(job.job_id, t.StepRecord(step=1, policy_version=1), "k1")
    got = await store.get_job(job.job_id)
    assert (got.step, got.policy_version) == (1, 1)
    assert len(await store.steps(job.job_id)) == 1


async def test_a_redone_step_replaces_its_record_and_is_marked_by_an_event() -> None:
    core, store, *_ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    await core.report_step(job.job_id, t.StepRecord(step=1, reward_mean=0.1), "j:1:run-a")
    outcome = await core.report_step(job.job_id, t.StepRecord(step=1, reward_mean=0.9),
                                     "j:1:run-b")
    assert outcome is StepAppend.REPLACED
    assert await store.steps(job.job_id) == [{"step": 1, "reward_mean": 0.9}]
    assert [(e["kind"], e["step"]) for e in await store.events(job.job_id)] == [
        ("step_redone", 1)]


# Malformed JSON (no step, a string step, ...) is the codec's to refuse
# (tests/unit/libra/test_wire_step_record.py); a typed record built in process out of
# range is the core's.
@pytest.mark.parametrize("record", [t.StepRecord(step=-1), t.StepRecord(step=MAX_NUM_STEPS + 1),
                                    t.StepRecord(step=1, policy_version=-2)])
async def test_a_step_record_out_of_range_is_refused_and_stores_nothing(
        record: t.StepRecord) -> None:
    core, store, *_ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    with pytest.raises(InvalidArgument) as info:
        await core.report_step(job.job_id, record)
    assert info.value.field == "step_json"
    assert await store.steps(job.job_id) == []


async def test_a_repeated_job_done_report_changes_nothing() -> None:
    # Keyed by job + outcome: the trainer's retry after a lost reply, or a late report
    # of another outcome, leaves the first end as it was.
    core, store, _, scheduler, clock = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    await core.report_job_done(job.job_id, t.JobState.SUCCEEDED, "trained 3 steps")
    ended_at_ms = (await store.get_job(job.job_id)).updated_at_ms
    clock.advance(5)
    await core.report_job_done(job.job_id, t.JobState.SUCCEEDED, "trained 3 steps")
    await core.report_job_done(job.job_id, t.JobState.FAILED, "late")
    again = await store.get_job(job.job_id)
    assert (again.state, again.message, again.updated_at_ms) == (
        t.JobState.SUCCEEDED, "trained 3 steps", ended_at_ms)
    assert scheduler.stopped == []


async def test_report_job_done_with_non_terminal_state_raises_invalid_argument() -> None:
    core, store, *_ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    with pytest.raises(InvalidArgument) as info:
        await core.report_job_done(job.job_id, t.JobState.RUNNING, "still going")
    assert info.value.field == "state"
    assert (await store.get_job(job.job_id)).state is t.JobState.RUNNING


async def test_report_job_failed_stops_scheduler_and_records_message() -> None:
    core, store, _, scheduler, _ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    await core.report_job_done(job.job_id, t.JobState.FAILED, "loss is nan")
    stored = await store.get_job(job.job_id)
    assert (stored.state, stored.message) == (t.JobState.FAILED, "loss is nan")
    assert scheduler.stopped == [job.job_id]


async def test_report_job_failed_ends_job_even_when_scheduler_is_unreachable() -> None:
    # Otherwise the job stays RUNNING forever and blocks every new job.
    core, store, *_ = make_core(scheduler=FakeRunner(stop_error=Unavailable("down")))
    job = await core.create_job(VALID_SPEC, "toml")
    await core.report_job_done(job.job_id, t.JobState.FAILED, "trainer crashed")
    assert (await store.get_job(job.job_id)).state is t.JobState.FAILED
