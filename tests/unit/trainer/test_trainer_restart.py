"""TrainerCore across stops and restarts: lost cancellations, pending entries re-read,
checkpoints and resume, a stop during the warm start, a start waiting for the previous
job's end report. In-memory store, fake backend and coordinator (trainer_rig.py)."""
# ruff: noqa: F811 - the imported ``rig`` fixture is a parameter of every test

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from libra import types as t
from libra.errors import FailedPrecondition
from services.trainer import checkpoint
from services.trainer.core import TrainerCore
from tests.fakes.coordinator import FakeCoordinator
from tests.unit.trainer.trainer_rig import (  # noqa: F401 - the rig fixture
    JOB,
    Rig,
    make_group,
    rig,
)
from tests.waiting import DEFAULT_TIMEOUT_S, wait_until

# -- restart -------------------------------------------------------------------------------

async def test_a_lost_cancellation_is_repeated_until_the_task_stops(rig: Rig) -> None:
    swallowed = asyncio.Event()

    async def loses_the_first_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # as seen inside redis-py under load: the task reads on
        await asyncio.sleep(3600)

    core = rig.new_core()
    core.job_id, core._task = JOB, asyncio.create_task(loses_the_first_cancel())
    await asyncio.sleep(0)  # let it start
    await core.stop_job(JOB)
    assert swallowed.is_set() and core._task.cancelled()


async def test_entries_read_before_a_restart_are_trained_after_it(rig: Rig) -> None:
    await rig.set_spec(prompts_per_step=2)
    await rig.write(*make_group(0))
    first = rig.new_core()
    await first.start_job(JOB)
    await wait_until(lambda: rig.pending())  # delivered to trainer-0, not acked
    await first.stop_job(JOB)
    await rig.write(*make_group(1))
    await rig.run_job()
    assert sorted(rig.backend.trained_ids) == ["tr-0-0", "tr-0-1", "tr-1-0", "tr-1-1"]
    assert await rig.pending() == 0


async def test_more_pending_entries_than_one_read_are_all_re_read(rig: Rig) -> None:
    await rig.set_spec(prompts_per_step=40, samples_per_prompt=2)
    await rig.write(*[tr for g in range(40) for tr in make_group(g)])
    await rig.store.ensure_group(JOB)
    await rig.store.read(JOB, "trainer-0", 1000, block_ms=1)
    assert await rig.pending() == 80  # a previous trainer-0 held them all
    await rig.run_job()
    assert len(set(rig.backend.trained_ids)) == 80


# -- checkpoint and resume -----------------------------------------------------------------

async def test_a_checkpoint_is_written_every_checkpoint_interval_steps(rig: Rig) -> None:
    await rig.set_spec(num_steps=4, checkpoint_interval=2, max_staleness=10)
    await rig.write(*[tr for g in range(4) for tr in make_group(g)])
    await rig.run_job()
    folders = sorted(p.name for p in (rig.tmp / "checkpoints").iterdir())
    assert folders == ["step_000002", "step_000004"]
    assert "checkpoint_s" in rig.coordinator.steps[1][1]


async def test_resume_continues_from_the_checkpoint_and_trains_nothing_twice(rig: Rig) -> None:
    await rig.set_spec(num_steps=4, checkpoint_interval=2, max_staleness=10)
    await rig.write(*[tr for g in range(3) for tr in make_group(g)])
    first = rig.new_core()
    await first.start_job(JOB)
    # Step 3 reported (the records below start with it), not just counted: ``step``
    # counts a step before its checkpoint and report are written.
    await wait_until(lambda: len(rig.coordinator.steps) == 3)
    await first.stop_job(JOB)  # as if killed: steps 1-3 done, checkpoint at step 2
    await rig.write(*[tr for g in range(3, 6) for tr in make_group(g)])
    second = rig.new_core()
    assert await second.resume() == [JOB]
    await rig.run_job(second)
    assert rig.backend.loaded_checkpoints[-1].endswith("step_000002")
    assert [s["step"] for _, s in rig.coordinator.steps] == [1, 2, 3, 3, 4]
    trained = rig.backend.trained_ids
    assert len(trained) == len(set(trained)) == 10  # 5 steps x 1 group x 2, none twice
    # Version 3 was the last published before the crash: the resumed trainer publishes
    # the checkpoint's weights as 4 (never reusing a number the rollout side may have
    # loaded), then 5 and 6 after the redone step 3 and step 4.
    assert [s["policy_version"] for _, s in rig.coordinator.steps] == [1, 2, 3, 5, 6]
    counters = await rig.counters()
    all_ids = [f"tr-{g}-{i}" for g in range(6) for i in range(2)]
    assert counters["trained"] == await rig.num_consumed(all_ids) == 10
    assert counters["produced"] - counters["trained"] == 2  # group 5: in the stream


async def test_a_cancel_and_resume_counts_every_trajectory_once_whatever_its_stage(
        rig: Rig) -> None:
    """The stack's cancel-and-resume job once reported ``unaccounted`` -4; the trainer's
    side is exact: held entries are re-read (not counted again), ones that went stale
    meanwhile are dropped once, and what is left stays in flight."""
    await rig.set_spec(num_steps=3, checkpoint_interval=1, max_staleness=1)
    await rig.write(*make_group(0), make_group(1)[0])  # step 1, and a half group held
    first = rig.new_core()
    await first.start_job(JOB)
    # Step 1 reported, hence checkpointed: ``step`` counts it before the checkpoint is
    # written (in a thread), and a stop before that write left no checkpoint to resume
    # from (seen under load: all three steps redone, 8 trained).
    await wait_until(lambda: len(rig.coordinator.steps) == 1)
    await wait_until(lambda: rig.pending())
    await first.stop_job(JOB)  # cancelled: tr-1-0 delivered, not acked
    await rig.write(make_group(1)[1])  # published while cancelled, never read
    second = rig.new_core()
    await second.start_job(JOB, resume=True)
    # Fresh groups for steps 2 and 3, and one more that stays in flight.
    await rig.write(*[tr for g in (2, 3, 4) for tr in make_group(g, version=100)])
    await rig.run_job(second)
    counters = await rig.counters()
    # Group 1 (version 0) is stale for the resumed policy: both members dropped, once.
    assert (counters["produced"], counters["trained"], counters["dropped_stale"]) == (10, 6, 2)
    in_flight = rig.store.num_pending(JOB) + rig.store.num_undelivered(JOB)
    assert in_flight == 2  # group 4
    assert counters["produced"] == (counters["trained"] + counters["dropped_stale"]
                                    + counters.get("dropped_failed", 0) + in_flight)
    ids = [f"tr-{g}-{i}" for g in range(5) for i in range(2)]
    assert await rig.num_consumed(ids) == 8
    trained = rig.backend.trained_ids
    assert len(trained) == len(set(trained)) == 6


async def test_resume_sends_the_checkpoint_steps_report_the_stop_may_have_lost(
        rig: Rig) -> None:
    # The stack stopped after the checkpoint of step 2 was written and before its report
    # reached the coordinator (the integration test saw step 8 missing this way).
    await rig.set_spec(num_steps=3, checkpoint_interval=2, max_staleness=10)
    report = {"record": {"step": 2, "policy_version": 2, "loss": 0.5}, "key": f"{JOB}:2:run-a"}
    checkpoint.save(rig.tmp / "checkpoints", 2, 2, rig.backend.save_checkpoint,
                    step_report=report)
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.resume()
    await rig.run_job(core)
    assert [(s["step"], s.get("loss")) for _, s in rig.coordinator.steps][:1] == [(2, 0.5)]
    assert [s["step"] for _, s in rig.coordinator.steps] == [2, 3]
    assert rig.coordinator.num_repeats == 0


async def test_a_delivered_checkpoint_report_sent_again_at_resume_is_a_repeat(
        rig: Rig) -> None:
    await rig.set_spec(num_steps=2, checkpoint_interval=2, max_staleness=10)
    await rig.write(*make_group(0), *make_group(1))
    await rig.run_job()
    assert [s["step"] for _, s in rig.coordinator.steps] == [1, 2]
    rig.store.set_job_state(JOB, "running")  # as if it was still running
    core = rig.new_core()
    await core.resume()
    await rig.run_job(core)
    assert [s["step"] for _, s in rig.coordinator.steps] == [1, 2]  # nothing stored twice
    assert rig.coordinator.num_repeats == 1


async def test_resume_without_a_checkpoint_warm_starts_again(rig: Rig) -> None:
    await rig.set_spec(num_steps=1, checkpoint_interval=0)
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.resume()
    await rig.run_job(core)
    assert rig.backend.warm_started == 1 and not rig.backend.loaded_checkpoints


async def test_a_corrupt_checkpoint_fails_the_job_naming_the_file(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, checkpoint_interval=1, max_staleness=10)
    await rig.write(*make_group(0), *make_group(1))
    await rig.run_job()
    (rig.tmp / "checkpoints" / "step_000002" / "state.txt").write_text("x")
    core = rig.new_core()
    await core.resume()
    await rig.run_job(core)
    _, state, message = rig.coordinator.done[-1]
    assert state is t.JobState.FAILED and "step_000002/state.txt" in message


async def test_a_non_finite_step_is_recorded_as_an_event(rig: Rig) -> None:
    rig.backend.metrics = {"loss": math.nan, "is_skipped": 1.0}
    await rig.write(*make_group(0))
    await rig.run_job()
    assert rig.event_kinds() == ["step_skipped_nonfinite"]


async def test_a_stop_during_the_warm_start_ends_it_and_frees_the_trainer(rig: Rig) -> None:
    """The warm start runs in a thread cancellation cannot reach; it asks before every
    SFT step whether to stop, so a cancelled job does not keep the trainer busy."""
    in_warm_start = threading.Event()
    stopped_early = threading.Event()

    def slow_warm_start(should_stop) -> dict[str, float]:  # noqa: ANN001
        in_warm_start.set()
        while not should_stop():  # minutes of SFT steps, one check each
            time.sleep(0.01)
        stopped_early.set()
        return {"sft_steps": 0}

    rig.backend.warm_start = slow_warm_start
    core = rig.new_core()
    await core.start_job(JOB)
    assert await asyncio.to_thread(in_warm_start.wait, DEFAULT_TIMEOUT_S)
    await core.stop_job(JOB)
    assert core._task.done()
    # The thread sees the stop at its next check (before the next SFT step).
    assert await asyncio.to_thread(stopped_early.wait, DEFAULT_TIMEOUT_S)
    await core.start_job(JOB)  # not "busy with" the stopped job
    await core.stop_job(JOB)  # and end this one's warm start too (its thread would linger)


class GatedCoordinator(FakeCoordinator):
    """Holds every job-done report until ``gate`` opens (the reply is in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.reporting = asyncio.Event()

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        self.reporting.set()
        await self.gate.wait()
        await super().report_job_done(job_id, state, message)


async def _ended_but_reporting(rig: Rig) -> TrainerCore:
    rig.coordinator = GatedCoordinator()
    core = rig.new_core()
    await rig.write(*make_group(0))
    await core.start_job(JOB)
    await asyncio.wait_for(rig.coordinator.reporting.wait(), DEFAULT_TIMEOUT_S)
    assert core.phase == "done" and not core._task.done()
    return core


async def test_a_start_waits_for_the_previous_jobs_done_report(rig: Rig) -> None:
    # The coordinator starts the next queued job when the job-done report arrives, so
    # that start can reach the trainer before the report's reply does.
    core = await _ended_but_reporting(rig)
    start = asyncio.create_task(core.start_job(JOB))
    await asyncio.sleep(0)
    assert not start.done()
    rig.coordinator.gate.set()
    await asyncio.wait_for(start, DEFAULT_TIMEOUT_S)
    assert rig.coordinator.done[0][1] is t.JobState.SUCCEEDED
    assert core.phase in ("warmup", "training")


async def test_a_start_is_refused_busy_when_the_report_never_finishes(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("services.trainer.core.END_REPORT_WAIT_S", 0.01)
    core = await _ended_but_reporting(rig)
    with pytest.raises(FailedPrecondition, match="busy"):
        await core.start_job(JOB)
    rig.coordinator.gate.set()
