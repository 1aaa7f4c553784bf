"""TrainerCore over a real Redis store, with a fake backend and a fake coordinator
(tests/fakes). Trajectories are written to the job's stream as the rollout store would."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, NotFound
from libra.jobspec import AlgorithmSpec, JobSpec, TaskSpec
from libra.retry import RetryPolicy
from libra.wire.common import encode_trajectory
from services.trainer import checkpoint
from services.trainer.core import TrainerCore
from services.trainer.store import RedisTrainerStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.sleep import FakeSleep
from tests.fakes.trainer_backend import FakeBackend, FakeBackendFactory
from tests.waiting import wait_until

JOB = "job-1"


def make_trajectory(group: int, index: int, version: int = 0, reward: float = 1.0,
                    status: t.TrajectoryStatus = t.TrajectoryStatus.FINISHED) -> t.Trajectory:
    """Prompt (2 tokens), a model turn (2 tokens at ``version``), a tool output (1)."""
    return t.Trajectory(
        t.TrajectoryId(f"tr-{group}-{index}"), t.JobId(JOB), t.GroupId(f"g-{group}"),
        t.PromptId(f"p-{group}"), "Q:1+2=", "3", status=status,
        token_ids=[1, 20, 4, 13, 8], num_prompt_tokens=2, loss_mask=[0, 0, 1, 1, 0],
        logprobs=[0.0, 0.0, -0.5, -0.25, 0.0], token_versions=[-1, -1, version, version, -1],
        reward=reward, num_turns=1)


def make_group(group: int, size: int = 2, version: int = 0,
               rewards: tuple[float, ...] = ()) -> list[t.Trajectory]:
    rewards = rewards or (1.0,) * size
    return [make_trajectory(group, i, version, rewards[i]) for i in range(size)]




@dataclass
class Rig:
    r: aioredis.Redis
    tmp: Path
    factory: FakeBackendFactory
    coordinator: FakeCoordinator
    cores: list[TrainerCore]
    sleep: FakeSleep | None = None

    @property
    def backend(self) -> FakeBackend:
        return self.factory.backend

    async def set_spec(self, **algorithm: Any) -> JobSpec:
        a = dict(num_steps=1, prompts_per_step=1, samples_per_prompt=2, sft_steps=0,
                 max_staleness=1, sync_interval=1)
        a.update(algorithm)
        spec = JobSpec(task=TaskSpec(num_prompts=64), algorithm=AlgorithmSpec(**a))
        await self.r.hset(keys.job(JOB), mapping={"spec_json": spec.to_json(),
                                                  "state": "running", "run_dir": str(self.tmp)})
        return spec

    def new_core(self, consumer: str = "trainer-0",
                 report_retry: RetryPolicy | None = None) -> TrainerCore:
        """A core whose report backoff runs on a fake clock (``self.sleep`` records it)."""
        clock = FakeClock()
        self.sleep = FakeSleep(clock)
        core = TrainerCore(RedisTrainerStore(self.r), self.factory, self.coordinator,
                           clock, consumer=consumer, block_ms=10,
                           report_retry=report_retry, sleep=self.sleep)
        self.cores.append(core)
        return core

    async def write(self, *trajs: t.Trajectory) -> None:
        """As the rollout store publishes: append to the stream and count it produced."""
        for traj in trajs:
            await self.r.xadd(keys.trajectories(JOB), {"trajectory_id": traj.trajectory_id,
                                                       "data": encode_trajectory(traj)})
            await self.r.hincrby(keys.counters(JOB), "produced", 1)

    async def run_job(self, core: TrainerCore | None = None, timeout_s: float = 5.0) -> TrainerCore:
        """Start the job on a new core (or keep the given one running) until it ends."""
        if core is None:
            core = self.new_core()
            await core.start_job(JOB)
        await asyncio.wait_for(core.wait(), timeout_s)
        return core

    async def counters(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in (await self.r.hgetall(keys.counters(JOB))).items()}

    async def pending(self) -> int:
        if not await self.r.exists(keys.trajectories(JOB)) or not any(
                g["name"] == keys.TRAINER_GROUP.encode()
                for g in await self.r.xinfo_groups(keys.trajectories(JOB))):
            return 0  # the trainer has not created its group yet
        return (await self.r.xpending(keys.trajectories(JOB), keys.TRAINER_GROUP))["pending"]


@pytest.fixture
async def rig(redis_server, tmp_path: Path) -> AsyncIterator[Rig]:
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    await r.flushdb()
    rig = Rig(r, tmp_path, FakeBackendFactory(), FakeCoordinator(), [])
    await rig.set_spec()
    yield rig
    for core in rig.cores:
        task = core._task  # stop what is still running; a test left it mid-read
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=2.0)
    await r.aclose()


# -- start ---------------------------------------------------------------------------------

async def test_version_zero_is_published_before_any_training(rig: Rig) -> None:
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: rig.r.exists(keys.policy(JOB)))
    policy = {k.decode(): v.decode() for k, v in (await rig.r.hgetall(keys.policy(JOB))).items()}
    assert policy["version"] == "0"
    assert policy["sha256"] == hashlib.sha256(Path(policy["weights_path"]).read_bytes()).hexdigest()
    assert policy["model_dir"] == str(rig.tmp / "model")
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


# -- steps, versions, job end --------------------------------------------------------------

async def test_versions_advance_every_sync_interval(rig: Rig) -> None:
    await rig.set_spec(num_steps=4, sync_interval=2, max_staleness=4)
    await rig.write(*[tr for g in range(4) for tr in make_group(g)])
    await rig.run_job()
    assert [rec["policy_version"] for _, rec in rig.coordinator.steps] == [0, 1, 1, 2]
    assert (await rig.r.hget(keys.policy(JOB), "version")) == b"2"
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
    await rig.r.xgroup_create(keys.trajectories(JOB), keys.TRAINER_GROUP, id="0")
    await rig.r.xreadgroup(keys.TRAINER_GROUP, "trainer-0", {keys.trajectories(JOB): ">"})
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
    await rig.r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await rig.write(*[tr for g in range(3) for tr in make_group(g)])
    first = rig.new_core()
    await first.start_job(JOB)
    await wait_until(lambda: first.step == 3)
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
    assert counters["trained"] == await rig.r.scard(keys.trained_ids(JOB)) == 10
    assert counters["produced"] - counters["trained"] == 2  # group 5: in the stream


async def test_resume_sends_the_checkpoint_steps_report_the_stop_may_have_lost(
        rig: Rig) -> None:
    # The stack stopped after the checkpoint of step 2 was written and before its report
    # reached the coordinator (the integration test saw step 8 missing this way).
    await rig.set_spec(num_steps=3, checkpoint_interval=2, max_staleness=10)
    await rig.r.zadd(keys.JOBS_INDEX, {JOB: 1})
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
    await rig.r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await rig.write(*make_group(0), *make_group(1))
    await rig.run_job()
    assert [s["step"] for _, s in rig.coordinator.steps] == [1, 2]
    await rig.r.hset(keys.job(JOB), "state", "running")  # as if it was still running
    core = rig.new_core()
    await core.resume()
    await rig.run_job(core)
    assert [s["step"] for _, s in rig.coordinator.steps] == [1, 2]  # nothing stored twice
    assert rig.coordinator.num_repeats == 1


async def test_resume_without_a_checkpoint_warm_starts_again(rig: Rig) -> None:
    await rig.set_spec(num_steps=1, checkpoint_interval=0)
    await rig.r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.resume()
    await rig.run_job(core)
    assert rig.backend.warm_started == 1 and not rig.backend.loaded_checkpoints


async def test_a_corrupt_checkpoint_fails_the_job_naming_the_file(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, checkpoint_interval=1, max_staleness=10)
    await rig.r.zadd(keys.JOBS_INDEX, {JOB: 1})
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
    events = await rig.r.xrange(keys.events(JOB))
    assert [e[b"kind"] for _, e in events] == [b"step_skipped_nonfinite"]


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
    await asyncio.to_thread(in_warm_start.wait, 5.0)
    await core.stop_job(JOB)
    assert core._task.done()
    # The thread sees the stop at its next check (before the next SFT step).
    assert await asyncio.to_thread(stopped_early.wait, 5.0)
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
    await asyncio.wait_for(rig.coordinator.reporting.wait(), 5.0)
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
    await asyncio.wait_for(start, 5.0)
    assert rig.coordinator.done[0][1] is t.JobState.SUCCEEDED
    assert core.phase in ("warmup", "training")


async def test_a_start_is_refused_busy_when_the_report_never_finishes(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("services.trainer.core.END_REPORT_WAIT_S", 0.01)
    core = await _ended_but_reporting(rig)
    with pytest.raises(FailedPrecondition, match="busy"):
        await core.start_job(JOB)
    rig.coordinator.gate.set()
