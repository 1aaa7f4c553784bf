"""Reconciliation: no job stays PENDING or RUNNING with nobody working on it.

Fakes: ``FakeTrainer`` (tests/fakes/runner.py) replaces the trainer's StartJob, StopJob
and GetTrainerStatus; ``FakeRunner`` the scheduler's; ``FakeClock`` + ``FakeSleep``
replace wall time and waiting. The store is the real ``InMemoryCoordinatorStore`` and
the spec parser is real. Every condition is set by hand: nothing races.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, Unavailable
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from services.coordinator.reconcile import (
    Action,
    ReconcileSettings,
    ReconcileWiring,
    Verdict,
    decide,
)
from tests.fakes.runner import FakeRunner, FakeTrainer
from tests.fakes.sleep import FakeSleep

SPEC = 'name = "unit"\n[algorithm]\nnum_steps = 3\n'
SETTINGS = ReconcileSettings(interval_s=5.0, trainer_lost_s=60.0, max_resumes=2)


class Rig:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.sleep = FakeSleep(self.clock)
        self.store = InMemoryCoordinatorStore(self.clock)
        self.trainer = FakeTrainer()
        self.scheduler = FakeRunner()
        self.core = CoordinatorCore(
            self.store, self.trainer, self.scheduler, self.clock,
            Path("/tmp/libra-test-runs"),
            reconcile=ReconcileWiring(self.trainer, SETTINGS, self.sleep))

    async def job(self, job_id: str) -> t.Job:
        return await self.store.get_job(job_id)

    async def reconciled(self, job_id: str) -> list[tuple[str, str]]:
        return [(e["action"], e["reason"]) for e in await self.store.events(job_id)
                if e["kind"] == "job_reconciled"]


def make_job(state: t.JobState, job_id: str = "j") -> t.Job:
    return t.Job(job_id=t.JobId(job_id), name="n", state=state, spec_json="{}",
                 created_at_ms=0, updated_at_ms=0)


# -- decide -----------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "status", "unreachable_s", "resumes", "action"), [
    (t.JobState.PENDING, t.TrainerStatus("j", "training"), 0, 0, Action.FAIL),
    (t.JobState.RUNNING, t.TrainerStatus("j", "warmup"), 0, 0, Action.NONE),
    (t.JobState.RUNNING, t.TrainerStatus("j", "training"), 0, 9, Action.NONE),
    (t.JobState.RUNNING, t.TrainerStatus("j", "done", message="trained 3 steps"), 0, 0,
     Action.SUCCEED),
    (t.JobState.RUNNING, t.TrainerStatus("j", "failed", message="nan"), 0, 0, Action.FAIL),
    (t.JobState.RUNNING, t.TrainerStatus("", "idle"), 0, 0, Action.RESUME),
    (t.JobState.RUNNING, t.TrainerStatus("j", "idle"), 0, 1, Action.RESUME),
    (t.JobState.RUNNING, t.TrainerStatus("other", "done"), 0, 0, Action.RESUME),
    (t.JobState.RUNNING, t.TrainerStatus("", "idle"), 0, 2, Action.FAIL),
    (t.JobState.RUNNING, None, 59.9, 0, Action.WAIT),
    (t.JobState.RUNNING, None, 60.0, 0, Action.FAIL),
])
def test_decide_covers_every_state_and_trainer_answer(
        state: t.JobState, status: t.TrainerStatus | None, unreachable_s: float,
        resumes: int, action: Action) -> None:
    verdict = decide(make_job(state), status, unreachable_s, resumes, SETTINGS)
    assert verdict.action is action
    assert (verdict.reason != "") == (action is not Action.NONE)


def test_decide_passes_the_trainers_message_on() -> None:
    done = decide(make_job(t.JobState.RUNNING), t.TrainerStatus("j", "done", message="ok 3"),
                  0, 0, SETTINGS)
    assert done == Verdict(Action.SUCCEED, "ok 3")


# -- the core's passes ------------------------------------------------------------------


async def test_a_healthy_job_is_left_alone() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    assert await rig.core.reconcile() == {job.job_id: Verdict(Action.NONE)}
    assert await rig.store.events(job.job_id) == []


async def test_a_running_job_no_trainer_holds_is_resumed_from_its_checkpoint() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.current = t.TrainerStatus("", "idle")  # the trainer lost it (restarted)
    verdicts = await rig.core.reconcile()
    assert verdicts[job.job_id].action is Action.RESUME
    assert rig.trainer.resumed == [job.job_id]
    assert rig.scheduler.started == [job.job_id, job.job_id]
    assert (await rig.job(job.job_id)).state is t.JobState.RUNNING
    assert [a for a, _ in await rig.reconciled(job.job_id)] == ["resume"]
    # The resumed trainer works on it: the next pass leaves it alone.
    assert (await rig.core.reconcile())[job.job_id].action is Action.NONE


async def test_a_job_the_trainer_finished_but_could_not_report_succeeds() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.current = t.TrainerStatus(job.job_id, "done", 3, 3, "trained 3 steps")
    await rig.core.reconcile()
    ended = await rig.job(job.job_id)
    assert (ended.state, ended.message) == (t.JobState.SUCCEEDED, "trained 3 steps")
    assert rig.trainer.resumed == []


async def test_a_job_the_trainer_failed_is_failed_and_the_next_submit_is_accepted() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.current = t.TrainerStatus(job.job_id, "failed", message="trainer: nan")
    await rig.core.reconcile()
    ended = await rig.job(job.job_id)
    assert (ended.state, ended.message) == (t.JobState.FAILED, "trainer: nan")
    assert rig.scheduler.stopped == [job.job_id]
    assert (await rig.core.create_job(SPEC, "toml")).state is t.JobState.RUNNING


async def test_a_pending_job_left_by_an_earlier_coordinator_is_failed_with_a_reason() -> None:
    rig = Rig()
    await rig.store.put_job(make_job(t.JobState.PENDING, "left"))
    await rig.core.reconcile()
    ended = await rig.job("left")
    assert ended.state is t.JobState.FAILED
    assert "interrupted while starting" in ended.message
    assert rig.trainer.stopped == ["left"] and rig.scheduler.stopped == ["left"]
    assert [a for a, _ in await rig.reconciled("left")] == ["fail"]
    assert (await rig.core.create_job(SPEC, "toml")).state is t.JobState.RUNNING


async def test_a_job_whose_trainer_stays_unreachable_fails_after_trainer_lost_s() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.status_error = Unavailable("connection refused")
    assert (await rig.core.reconcile())[job.job_id].action is Action.WAIT
    rig.clock.advance(59.0)
    assert (await rig.core.reconcile())[job.job_id].action is Action.WAIT
    rig.clock.advance(1.0)
    assert (await rig.core.reconcile())[job.job_id].action is Action.FAIL
    ended = await rig.job(job.job_id)
    assert (ended.state, ended.message) == (t.JobState.FAILED, "trainer unreachable for 60s")


async def test_a_trainer_that_answers_again_restarts_the_unreachable_clock() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.status_error = Unavailable("restarting")
    await rig.core.reconcile()
    rig.clock.advance(50.0)
    rig.trainer.status_error = None  # back, and it resumed the job itself
    assert (await rig.core.reconcile())[job.job_id].action is Action.NONE
    rig.trainer.status_error = Unavailable("restarting again")
    rig.clock.advance(50.0)
    assert (await rig.core.reconcile())[job.job_id].action is Action.WAIT


async def test_a_resume_the_trainer_refuses_fails_the_job_with_the_reason() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.current = t.TrainerStatus("", "idle")
    rig.trainer.start_error = FailedPrecondition("spec unreadable")
    await rig.core.reconcile()
    ended = await rig.job(job.job_id)
    assert ended.state is t.JobState.FAILED
    assert "resume failed: spec unreadable" in ended.message


async def test_resumes_are_bounded_then_the_job_fails() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    actions = []
    for _ in range(3):
        rig.trainer.current = t.TrainerStatus("", "idle")  # it keeps losing the job
        actions.append((await rig.core.reconcile())[job.job_id].action)
    assert actions == [Action.RESUME, Action.RESUME, Action.FAIL]
    assert "after 2 resumes" in (await rig.job(job.job_id)).message


async def test_a_pass_waits_for_a_create_instead_of_failing_its_pending_job() -> None:
    rig = Rig()
    gate = asyncio.Event()
    started = rig.trainer.start_job

    async def slow_start(job_id: str, resume: bool = False) -> None:
        await gate.wait()
        await started(job_id, resume)

    rig.trainer.start_job = slow_start  # type: ignore[method-assign]
    create = asyncio.create_task(rig.core.create_job(SPEC, "toml"))
    while not await rig.store.list_jobs():  # the job is stored PENDING; start blocks
        await asyncio.sleep(0)
    reconcile = asyncio.create_task(rig.core.reconcile())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not reconcile.done()  # it waits for the create's lifecycle lock
    gate.set()
    job = await create
    assert await reconcile == {job.job_id: Verdict(Action.NONE)}
    assert (await rig.job(job.job_id)).state is t.JobState.RUNNING


async def test_a_job_done_report_racing_a_pass_ends_the_job_once() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.current = t.TrainerStatus(job.job_id, "failed", message="trainer: nan")
    gate = asyncio.Event()
    stop = rig.scheduler.stop_job

    async def slow_stop(job_id: str) -> None:
        await gate.wait()
        await stop(job_id)

    rig.scheduler.stop_job = slow_stop  # type: ignore[method-assign]
    reconcile = asyncio.create_task(rig.core.reconcile())
    for _ in range(20):
        await asyncio.sleep(0)  # the pass holds the lock, ending the job
    report = asyncio.create_task(rig.core.report_job_done(job.job_id, t.JobState.FAILED,
                                                          "trainer: nan"))
    for _ in range(20):
        await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(reconcile, report)
    assert rig.scheduler.stopped == [job.job_id]  # ended once, not twice
    assert (await rig.job(job.job_id)).state is t.JobState.FAILED


async def test_a_cancel_during_a_create_ends_the_job_cancelled() -> None:
    rig = Rig()
    gate = asyncio.Event()
    started = rig.scheduler.start_job

    async def slow_start(job_id: str, resume: bool = False) -> None:
        await gate.wait()
        await started(job_id, resume)

    rig.scheduler.start_job = slow_start  # type: ignore[method-assign]
    create = asyncio.create_task(rig.core.create_job(SPEC, "toml"))
    while not (jobs := await rig.store.list_jobs()):
        await asyncio.sleep(0)
    cancel = asyncio.create_task(rig.core.cancel_job(jobs[0].job_id))
    await asyncio.sleep(0)
    gate.set()
    await create
    assert (await cancel).state is t.JobState.CANCELLED
    assert rig.trainer.current.phase == "idle"  # nothing keeps working for it


async def test_the_loop_reconciles_at_start_and_every_interval() -> None:
    rig = Rig()
    job = await rig.core.create_job(SPEC, "toml")
    rig.trainer.current = t.TrainerStatus("", "idle")

    async def sleep_twice(delay_s: float) -> None:
        rig.sleep.delays_s.append(delay_s)
        if len(rig.sleep.delays_s) == 2:
            raise asyncio.CancelledError

    rig.core._reconciler._sleep = sleep_twice  # type: ignore[union-attr]
    with pytest.raises(asyncio.CancelledError):
        await rig.core.run_reconciler()
    assert rig.sleep.delays_s == [5.0, 5.0]
    assert rig.trainer.resumed == [job.job_id]  # first pass resumed; second saw it working


async def test_a_failing_pass_is_logged_and_the_next_one_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    calls = 0
    listed = rig.store.list_jobs

    async def flaky_list() -> list[t.Job]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("redis away")
        return await listed()

    async def sleep_twice(delay_s: float) -> None:
        if calls >= 2:  # the second pass lists again (and so does its queue start)
            raise asyncio.CancelledError

    rig.store.list_jobs = flaky_list  # type: ignore[method-assign]
    rig.core._reconciler._sleep = sleep_twice  # type: ignore[union-attr]
    with pytest.raises(asyncio.CancelledError):
        await rig.core.run_reconciler()
    assert calls >= 2
    assert "[reconcile] pass failed" in caplog.text


def test_inconsistent_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        ReconcileSettings(interval_s=0)
