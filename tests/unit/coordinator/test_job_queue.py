"""The job queue and resume, through CoordinatorCore, on ``InMemoryCoordinatorStore``
(no redis-server: a unit test). ``tests/store/test_coordinator_job_queue_redis.py`` runs
every test here again on ``RedisCoordinatorStore`` against a real redis-server.

Fakes: ``FakeRunner``/``FakeTrainer`` replace the trainer's and scheduler's gRPC
clients (they record starts, resume flags and stops, and refuse when told to);
``FakeClock`` replaces wall time. Checkpoints are real folders in ``tmp_path``, read by
the production probe.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from services.coordinator.reconcile import ReconcileSettings, ReconcileWiring
from services.coordinator.store_protocol import CoordinatorStore
from tests.fakes.runner import FakeRunner, FakeTrainer
from tests.fakes.sleep import FakeSleep

SPEC = 'name = "q"\n[algorithm]\nnum_steps = 3\n'


class Rig:
    def __init__(self, store: CoordinatorStore, clock: FakeClock, run_root: Path,
                 max_queued_jobs: int = 100) -> None:
        self.store, self.clock, self.run_root = store, clock, run_root
        self.trainer, self.scheduler = FakeTrainer(), FakeRunner()
        self.core = CoordinatorCore(
            store, self.trainer, self.scheduler, clock, run_root,
            max_queued_jobs=max_queued_jobs,
            reconcile=ReconcileWiring(self.trainer, ReconcileSettings(), FakeSleep(clock)))

    async def submit(self, priority: int = 0) -> t.Job:
        return await self.core.create_job(SPEC, "toml", priority)

    async def state(self, job_id: str) -> t.JobState:
        return (await self.store.get_job(job_id)).state

    async def end(self, job_id: str, state: t.JobState = t.JobState.SUCCEEDED) -> None:
        """The trainer's job-done report, then the queue's start of the next job."""
        await self.core.report_job_done(job_id, state, "ended")
        await self.core.settle()

    def checkpoint(self, job: t.Job, step: int) -> None:
        folder = Path(job.run_dir) / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"step": step, "policy_version": step,
                                                      "files": {}}))


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    clock = FakeClock()
    return Rig(InMemoryCoordinatorStore(clock), clock, tmp_path)


@pytest.fixture(autouse=True)
async def _settled(rig: Rig) -> AsyncIterator[None]:
    yield
    await rig.core.settle()  # no background start outlives the test's Redis client


def _small(rig: Rig, max_queued_jobs: int) -> Rig:
    return Rig(rig.store, rig.clock, rig.run_root, max_queued_jobs)


# -- queue ----------------------------------------------------------------------------


async def test_jobs_submitted_while_one_runs_start_in_submit_order(rig: Rig) -> None:
    first, second, third = [await rig.submit() for _ in range(3)]
    assert [j.state for j in (first, second, third)] == [
        t.JobState.RUNNING, t.JobState.PENDING, t.JobState.PENDING]
    assert (second.queue_position, third.queue_position) == (1, 2)
    await rig.end(first.job_id)
    assert await rig.state(second.job_id) is t.JobState.RUNNING
    assert {j.job_id: j.queue_position for j in await rig.core.list_jobs()} == {
        first.job_id: 0, second.job_id: 0, third.job_id: 1}
    await rig.end(second.job_id, t.JobState.FAILED)
    assert await rig.state(third.job_id) is t.JobState.RUNNING
    assert rig.trainer.started == [first.job_id, second.job_id, third.job_id]
    assert rig.scheduler.started == rig.trainer.started


async def test_higher_priority_starts_first_and_equal_ones_keep_submit_order(
        rig: Rig) -> None:
    running = await rig.submit()
    low, mid_a, high, mid_b = [await rig.submit(p) for p in (-5, 3, 7, 3)]
    positions = {j.job_id: j.queue_position for j in await rig.core.list_jobs()}
    assert [positions[j.job_id] for j in (running, low, mid_a, high, mid_b)] == [
        0, 4, 2, 1, 3]
    order = []
    current = running
    for _ in range(4):
        await rig.end(current.job_id)
        current = next(j for j in await rig.core.list_jobs() if j.state is t.JobState.RUNNING)
        order.append(current.job_id)
    assert order == [high.job_id, mid_a.job_id, mid_b.job_id, low.job_id]


async def test_cancel_of_a_queued_job_calls_neither_trainer_nor_scheduler(rig: Rig) -> None:
    running, queued, after = [await rig.submit() for _ in range(3)]
    cancelled = await rig.core.cancel_job(queued.job_id, "not needed")
    await rig.core.settle()
    assert (cancelled.state, cancelled.message) == (t.JobState.CANCELLED, "not needed")
    assert rig.trainer.stopped == [] and rig.scheduler.stopped == []
    assert await rig.state(running.job_id) is t.JobState.RUNNING
    assert (await rig.core.get_job(after.job_id))[0].queue_position == 1
    await rig.end(running.job_id)
    assert await rig.state(after.job_id) is t.JobState.RUNNING
    assert queued.job_id not in rig.trainer.started


async def test_cancel_of_the_running_job_starts_the_next(rig: Rig) -> None:
    running, queued = await rig.submit(), await rig.submit()
    await rig.core.cancel_job(running.job_id)
    await rig.core.settle()
    assert await rig.state(running.job_id) is t.JobState.CANCELLED
    assert await rig.state(queued.job_id) is t.JobState.RUNNING


async def test_reconciliation_failing_the_running_job_starts_the_next(rig: Rig) -> None:
    running, queued = await rig.submit(), await rig.submit()
    rig.trainer.current = t.TrainerStatus(job_id=running.job_id, phase="failed",
                                          message="trainer: out of memory")
    await rig.core.reconcile()
    await rig.core.settle()
    assert await rig.state(running.job_id) is t.JobState.FAILED
    assert await rig.state(queued.job_id) is t.JobState.RUNNING


async def test_a_refused_start_fails_that_job_with_the_reason_and_tries_the_next(
        rig: Rig) -> None:
    running, doomed, fine = [await rig.submit() for _ in range(3)]
    rig.scheduler.start_error = Unavailable("scheduler down")
    refusals = 0
    original = rig.scheduler.start_job

    async def refuse_once(job_id: str, resume: bool = False) -> None:
        nonlocal refusals
        if refusals == 0:
            refusals += 1
            raise Unavailable("scheduler down")
        rig.scheduler.start_error = None
        await original(job_id, resume)

    rig.scheduler.start_job = refuse_once  # type: ignore[method-assign]
    await rig.end(running.job_id)
    failed = await rig.store.get_job(doomed.job_id)
    assert failed.state is t.JobState.FAILED and "scheduler down" in failed.message
    assert [e["kind"] for e in await rig.store.events(doomed.job_id)] == ["job_start_failed"]
    assert doomed.job_id in rig.trainer.stopped  # the trainer had taken it: stopped again
    assert await rig.state(fine.job_id) is t.JobState.RUNNING


async def test_a_full_queue_refuses_with_resource_exhausted_naming_the_limit(
        rig: Rig) -> None:
    small = _small(rig, 2)
    await small.submit()
    queued = [await small.submit() for _ in range(2)]
    with pytest.raises(ResourceExhausted, match="max_queued_jobs = 2"):
        await small.submit()
    assert len(await small.store.list_jobs()) == 3
    await small.core.cancel_job(queued[0].job_id)
    assert (await small.submit()).queue_position == 2  # room again


async def test_a_thousand_submits_are_bounded_and_every_queued_job_runs_once(
        rig: Rig) -> None:
    accepted, refused = [], 0
    for _ in range(1000):
        try:
            accepted.append(await rig.submit())
        except ResourceExhausted:
            refused += 1
    assert (len(accepted), refused) == (101, 899)  # 1 running + max_queued_jobs = 100
    assert len(await rig.store.list_jobs()) == 101
    for job in accepted:
        assert await rig.state(job.job_id) is t.JobState.RUNNING
        await rig.end(job.job_id)
    assert rig.trainer.started == [j.job_id for j in accepted]
    assert await rig.store.queued_job_ids() == []


async def test_queue_survives_a_coordinator_restart_and_a_pass_starts_its_head(
        rig: Rig) -> None:
    running, queued = await rig.submit(), await rig.submit()
    await rig.core.settle()  # the first coordinator is gone from here on
    # The job ended while no coordinator ran (the store says so; nothing started next).
    ended = await rig.store.get_job(running.job_id)
    ended.state = t.JobState.SUCCEEDED
    await rig.store.put_job(ended)
    restarted = Rig(rig.store, rig.clock, rig.run_root)
    assert {j.job_id: j.queue_position for j in await restarted.core.list_jobs()} == {
        running.job_id: 0, queued.job_id: 1}
    await restarted.core.reconcile()
    await restarted.core.settle()
    assert await restarted.state(queued.job_id) is t.JobState.RUNNING
    assert restarted.trainer.started == [queued.job_id]


async def test_out_of_range_priority_is_refused_naming_the_field(rig: Rig) -> None:
    with pytest.raises(InvalidArgument) as err:
        await rig.submit(1001)
    assert err.value.field == "priority"
    assert await rig.store.list_jobs() == []


# -- resume ---------------------------------------------------------------------------


async def test_resume_restarts_a_cancelled_job_from_its_checkpoint_under_its_id(
        rig: Rig) -> None:
    job = await rig.submit()
    rig.checkpoint(job, 2)
    await rig.core.cancel_job(job.job_id)
    resumed = await rig.core.resume_job(job.job_id)
    assert (resumed.job_id, resumed.state, resumed.num_resumes) == (
        job.job_id, t.JobState.RUNNING, 1)
    assert rig.trainer.resumed == [job.job_id] and rig.scheduler.resumed == [job.job_id]
    events = await rig.store.events(job.job_id)
    assert [(e["kind"], e["checkpoint_step"]) for e in events] == [("job_resumed", 2)]


async def test_resume_while_another_job_runs_queues_it_and_starts_it_resumed(
        rig: Rig) -> None:
    failed = await rig.submit()
    rig.checkpoint(failed, 1)
    await rig.end(failed.job_id, t.JobState.FAILED)
    other = await rig.submit()
    resumed = await rig.core.resume_job(failed.job_id, priority=1)
    assert (resumed.state, resumed.queue_position) == (t.JobState.PENDING, 1)
    await rig.end(other.job_id)
    assert await rig.state(failed.job_id) is t.JobState.RUNNING
    assert rig.trainer.resumed == [failed.job_id]


async def test_resume_without_a_checkpoint_is_refused_and_changes_nothing(rig: Rig) -> None:
    job = await rig.submit()
    await rig.core.cancel_job(job.job_id, "stop")
    with pytest.raises(FailedPrecondition, match="no checkpoint"):
        await rig.core.resume_job(job.job_id)
    after = await rig.store.get_job(job.job_id)
    assert (after.state, after.message, after.num_resumes) == (
        t.JobState.CANCELLED, "stop", 0)
    assert await rig.store.events(job.job_id) == []
    assert rig.trainer.started == [job.job_id]


@pytest.mark.parametrize("end", ["running", "pending", "succeeded"])
async def test_resume_of_a_job_not_cancelled_or_failed_is_refused(rig: Rig, end: str) -> None:
    job = await rig.submit()
    if end == "pending":
        job = await rig.submit()
    if end == "succeeded":
        await rig.end(job.job_id)
    rig.checkpoint(job, 1)
    with pytest.raises(FailedPrecondition, match=f"is {end}; only a cancelled or failed"):
        await rig.core.resume_job(job.job_id)
    assert await rig.state(job.job_id) is t.JobState(end)


async def test_resume_of_an_unknown_job_is_not_found(rig: Rig) -> None:
    with pytest.raises(NotFound):
        await rig.core.resume_job("no-such-job")


async def test_a_refused_resume_start_leaves_the_job_failed_with_the_reason(rig: Rig) -> None:
    job = await rig.submit()
    rig.checkpoint(job, 1)
    await rig.core.cancel_job(job.job_id)
    rig.trainer.start_error = Unavailable("trainer down")
    with pytest.raises(FailedPrecondition, match="trainer down"):
        await rig.core.resume_job(job.job_id)
    assert await rig.state(job.job_id) is t.JobState.FAILED
    assert await rig.store.queued_job_ids() == []


async def test_a_stale_job_done_report_for_a_queued_resumed_job_is_ignored(rig: Rig) -> None:
    job = await rig.submit()
    rig.checkpoint(job, 1)
    await rig.core.cancel_job(job.job_id)
    await rig.submit()  # runs: the resumed job has to queue
    await rig.core.resume_job(job.job_id)
    await rig.core.report_job_done(job.job_id, t.JobState.FAILED, "late report")
    assert await rig.state(job.job_id) is t.JobState.PENDING
