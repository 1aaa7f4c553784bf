"""RolloutCore's busy loop over a real Redis store, with fakes for engine, tool gateway,
scheduler and coordinator (tests/fakes). The core runs as a task; tests wait for the
observable result (a stream entry, a counter) with a bounded poll."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import BucketSpec, JobSpec, LayoutSpec, TaskSpec, ToolsSpec
from libra.wire.common import decode_trajectory, encode_trajectory
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.store import RedisRolloutStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.engine import BlockUntilAbort, FakeEngine, FakeEngineLoader, make_tokenizer
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway, tool_result
from tests.waiting import wait_until

JOB = "job-1"
HERE = "ro-1"
THERE = "ro-2"


def make_task(index: int = 0, prompt: str = "Q:1+2=", reference: str = "3") -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId(f"tr-{index}"), t.JobId(JOB), t.GroupId("g-0"),
                        t.PromptId("p-0"), prompt, reference)




@dataclass
class Rig:
    r: aioredis.Redis
    tmp: Path
    core: RolloutCore
    engine: FakeEngine
    tools: FakeToolGateway
    scheduler: FakeScheduler
    coordinator: FakeCoordinator
    clock: FakeClock
    task: asyncio.Task | None = None

    async def write_weights(self, version: int, sha256: str | None = None) -> str:
        path = self.tmp / f"v{version}.safetensors"
        data = f"weights v{version}".encode()
        path.write_bytes(data)
        await self.r.hset(keys.policy(JOB), mapping={
            "version": version, "weights_path": str(path),
            "sha256": sha256 or hashlib.sha256(data).hexdigest(),
            "model_dir": str(self.tmp / "model"), "published_at_ms": 0})
        return str(path)

    async def place(self, traj: t.Trajectory, instance: str = HERE,
                    assign: bool = True) -> None:
        """As the scheduler places: inbox entry, task, and (``assign``) the assignment
        and load a handoff checks and moves."""
        data = encode_trajectory(traj)
        await self.r.xadd(keys.inbox(instance), {"job_id": traj.job_id, "task": data})
        await self.r.hset(keys.tasks(JOB), traj.trajectory_id, data)
        if assign:
            await self.r.hset(keys.assignments(JOB), traj.trajectory_id, instance)
            await self.r.hincrby(keys.load(JOB), instance, 1)

    async def load(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in (await self.r.hgetall(keys.load(JOB))).items()}

    async def published(self) -> list[t.Trajectory]:
        return [decode_trajectory(f[b"data"]) for _, f in await self.r.xrange(
            keys.trajectories(JOB))]

    async def num_published(self) -> int:
        return await self.r.xlen(keys.trajectories(JOB))

    async def inbox_pending(self, instance: str = HERE) -> int:
        return (await self.r.xpending(keys.inbox(instance), keys.ROLLOUT_GROUP))["pending"]

    async def events(self, kind: str) -> list[dict[bytes, bytes]]:
        return [f for _, f in await self.r.xrange(keys.events(JOB)) if f[b"kind"] == kind.encode()]

    def start(self) -> None:
        self.task = asyncio.create_task(self.core.run())

    async def run_until_published(self, count: int = 1) -> list[t.Trajectory]:
        if self.task is None:
            self.start()
        await wait_until(lambda: self._published_at_least(count))
        return await self.published()

    async def _published_at_least(self, count: int) -> bool:
        return await self.num_published() >= count

    async def stop(self) -> None:
        if self.task is None:
            return
        await self.core.drain(0.0)
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 1.0)
        except (TimeoutError, Exception):
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def rig(redis_server, tmp_path: Path) -> AsyncIterator[Rig]:
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    await r.flushdb()
    spec = JobSpec(task=TaskSpec(max_turns=4), tools=ToolsSpec(call_timeout_s=5.0))
    await r.hset(keys.job(JOB), mapping={"spec_json": spec.to_json(), "state": "running",
                                          "run_dir": str(tmp_path)})
    clock = FakeClock()
    engine = FakeEngine(make_tokenizer())
    tools = FakeToolGateway(clock=clock)
    scheduler = FakeScheduler()
    coordinator = FakeCoordinator(redis=r)  # mirrors the lease: publishing is fenced
    settings = RolloutSettings(instance_id=HERE, bucket="short", lease_ttl_ms=60_000,
                               tool_deadline_s=5.0, idle_block_ms=5)
    core = RolloutCore(settings, RedisRolloutStore(r), FakeEngineLoader(engine), tools,
                       scheduler, coordinator, clock)
    rig = Rig(r, tmp_path, core, engine, tools, scheduler, coordinator, clock)
    await rig.write_weights(0)
    await core.register()
    await r.xgroup_create(keys.inbox(THERE), keys.ROLLOUT_GROUP, id="0", mkstream=True)
    yield rig
    await rig.stop()
    await r.aclose()


# -- answer in one turn --------------------------------------------------------------------

async def test_answer_in_one_turn_is_published_with_the_gateway_reward(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    rig.tools.reward = 0.75
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert (traj.trajectory_id, traj.status, traj.reward, traj.final_text) == (
        "tr-0", t.TrajectoryStatus.FINISHED, 0.75, "3")
    assert rig.tools.scores[0]["reference"] == "3"


async def test_published_trajectory_is_aligned_and_stamped_with_this_instance(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.check_aligned() is None
    assert (traj.instance_id, traj.bucket, traj.num_turns) == (HERE, "short", 1)
    assert traj.finished_at_ms == rig.clock.now_ms()


async def test_published_trajectory_inbox_entry_is_acked_and_deleted(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert await rig.r.xlen(keys.inbox(HERE)) == 0
    assert await rig.inbox_pending() == 0


async def test_published_trajectory_counts_produced(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert await rig.r.hgetall(keys.counters(JOB)) == {b"produced": b"1"}


async def test_published_entry_carries_what_the_scheduler_reads_to_free_the_slot(
        rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    ((_, fields),) = await rig.r.xrange(keys.trajectories(JOB))
    assert (fields[b"trajectory_id"], fields[b"total_tokens"], fields[b"status"],
            fields[b"instance_id"]) == (b"tr-0", str(traj.num_generated_tokens).encode(),
                                        b"finished", HERE.encode())


async def test_result_of_an_instance_whose_lease_moved_on_is_not_published(
        rig: Rig) -> None:
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    # A newer grant of this instance's lease (this process is now a zombie).
    await rig.r.hset(keys.lease(HERE), "epoch", rig.coordinator.epoch + 1)
    rig.tools.gate.set()
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.num_published() == 0
    assert await rig.r.hgetall(keys.counters(JOB)) == {}
    assert await rig.inbox_pending() == 1  # not acknowledged either: it stays re-placeable


async def test_result_of_an_instance_whose_lease_expired_is_not_published(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.r.delete(keys.lease(HERE))
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.engine.requests)
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.num_published() == 0


async def test_tool_return_reports_carry_the_lease_epoch(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    (report,) = rig.scheduler.tool_returns
    assert report["lease_epoch"] == rig.coordinator.epoch == 1


async def test_ready_trajectories_share_one_engine_call(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>", "<ans>4</ans>")
    await rig.place(make_task(0))
    await rig.place(make_task(1))
    await rig.run_until_published(2)
    assert rig.engine.batch_sizes == [2]


async def test_task_of_an_unknown_job_is_acked_and_dropped(rig: Rig) -> None:
    stranger = make_task()
    stranger.job_id = t.JobId("no-such-job")
    await rig.place(stranger)
    rig.start()
    await wait_until(lambda: _inbox_empty(rig))
    assert rig.engine.requests == [] and rig.core.num_active == 0


async def _inbox_empty(rig: Rig) -> bool:
    return await rig.r.xlen(keys.inbox(HERE)) == 0 and await rig.inbox_pending() == 0


# -- tool calls ----------------------------------------------------------------------------

async def test_tool_output_is_appended_masked_and_the_next_turn_sees_it(rig: Rig) -> None:
    tok = make_tokenizer()
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    rig.tools.results.append(tool_result("3"))
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    prompt, calc, res, ans = (tok.encode_prompt("Q:1+2="), tok.encode("<calc>1+2</calc>"),
                              tok.encode("<res>3</res>"), tok.encode("<ans>3</ans>"))
    assert traj.token_ids == prompt + calc + res + ans
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(calc) + [0] * len(res) + [1] * len(ans)
    assert rig.engine.requests[1].prompt_token_ids == prompt + calc + res
    assert rig.tools.calls[0]["args"] == {"expression": "1+2"}
    assert traj.num_turns == 2 and traj.tool_return_positions == [len(calc) + len(res)]


async def test_tool_return_is_reported_to_the_scheduler(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    (report,) = rig.scheduler.tool_returns
    assert (report["trajectory_id"], report["state"], report["instance_id"]) == (
        "tr-0", traj.tool_states[0], HERE)


async def test_tool_gateway_down_until_deadline_publishes_failed(rig: Rig) -> None:
    rig.tools.fail_times, rig.tools.advance_s_per_call = -1, 2.0
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FAILED
    assert traj.failure_reason.startswith("tool gateway")
    assert await rig.r.hgetall(keys.counters(JOB)) == {b"failed": b"1"}
    assert len({c["call_id"] for c in rig.tools.calls}) == 1  # retries reuse the call id


async def test_core_keeps_serving_after_a_tool_failure(rig: Rig) -> None:
    rig.tools.fail_times, rig.tools.advance_s_per_call = -1, 2.0
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    rig.tools.fail_times = 0
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    trajs = await rig.run_until_published(2)
    assert trajs[1].status is t.TrajectoryStatus.FINISHED


async def test_tool_gateway_down_twice_is_retried_to_success(rig: Rig) -> None:
    rig.tools.fail_times, rig.tools.advance_s_per_call = 2, 0.5
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FINISHED
    assert len(rig.tools.calls) == 3


# -- placement decisions -------------------------------------------------------------------

async def test_move_decision_hands_the_trajectory_to_the_target_inbox_intact(rig: Rig) -> None:
    tok = make_tokenizer()
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.r.xlen(keys.inbox(THERE)))
    ((_, fields),) = await rig.r.xrange(keys.inbox(THERE))
    moved = decode_trajectory(fields[b"task"])
    prompt, calc, res = (tok.encode_prompt("Q:1+2="), tok.encode("<calc>1+2</calc>"),
                         tok.encode("<res>3</res>"))
    assert moved.token_ids == prompt + calc + res
    assert moved.loss_mask == [0] * len(prompt) + [1] * len(calc) + [0] * len(res)
    assert moved.logprobs == [0.0] * len(prompt) + [-0.5] * len(calc) + [0.0] * len(res)
    assert moved.token_versions == [-1] * len(prompt) + [0] * len(calc) + [-1] * len(res)
    assert (moved.num_migrations, moved.num_turns, fields[b"job_id"]) == (1, 1, JOB.encode())


async def test_move_decision_acks_the_entry_here_and_frees_the_slot(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.r.xlen(keys.inbox(THERE)))
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.inbox_pending() == 0 and await rig.r.xlen(keys.inbox(HERE)) == 0
    assert await rig.num_published() == 0
    assert await rig.r.hexists(keys.tasks(JOB), "tr-0")


async def test_move_to_this_instance_keeps_the_trajectory_here(rig: Rig) -> None:
    rig.scheduler.move_to(HERE)
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.num_migrations == 0 and await rig.r.xlen(keys.inbox(THERE)) == 0


async def test_handed_over_trajectory_continues_from_its_tokens(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.r.xlen(keys.inbox(THERE)))
    ((_, fields),) = await rig.r.xrange(keys.inbox(THERE))
    moved = decode_trajectory(fields[b"task"])
    # Back on this instance (e.g. re-placed): the agent keeps its tokens, one more turn.
    rig.engine.queue("<ans>3</ans>")
    await rig.place(moved)
    (traj,) = await rig.run_until_published()
    assert traj.token_ids[:len(moved.token_ids)] == moved.token_ids
    assert traj.num_turns == 2 and rig.engine.requests[-1].prompt_token_ids == moved.token_ids


async def test_handoff_commits_the_move_in_assignment_load_and_counters(rig: Rig) -> None:
    rig.scheduler.move_to(THERE, bucket="long")
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.r.xlen(keys.inbox(THERE)))
    assert await rig.r.hget(keys.assignments(JOB), "tr-0") == THERE.encode()
    assert await rig.load() == {HERE: 0, THERE: 1}
    assert await rig.r.hgetall(keys.counters(JOB)) == {b"migrations": b"1",
                                                       b"placed:long": b"1"}
    assert rig.core.num_moves_handed_off == 1


async def test_tool_return_does_not_wait_for_the_decision(rig: Rig) -> None:
    rig.scheduler.gate = asyncio.Event()  # the scheduler has not answered yet
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.num_turns == 2 and len(rig.scheduler.tool_returns) == 1
    assert rig.scheduler.num_answered == 0


async def test_move_decided_after_the_trajectory_finished_is_moot(rig: Rig) -> None:
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    rig.scheduler.gate.set()
    await wait_until(lambda: rig.core.num_moves_moot == 1)
    assert await rig.r.xlen(keys.inbox(THERE)) == 0
    # Never committed: the assignment and load still say where it ran.
    assert await rig.r.hget(keys.assignments(JOB), "tr-0") == HERE.encode()
    assert await rig.load() == {HERE: 1}
    assert await rig.r.hgetall(keys.counters(JOB)) == {b"produced": b"1"}


async def test_move_decided_during_the_next_turn_hands_off_at_its_tool_return(
        rig: Rig) -> None:
    """The decision of tool return 1 comes while the trajectory is in its tool call 2:
    it leaves after tool return 2, whose own decision (a STAY pinned there) is awaited."""
    tok = make_tokenizer()
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.scheduler.stay_at(THERE)

    async def release_decision_in_second_call() -> None:
        if len(rig.tools.calls) == 2:
            rig.scheduler.gate.set()
            await wait_until(lambda: rig.scheduler.num_answered == 1)

    rig.tools.on_execute = release_decision_in_second_call
    rig.engine.queue("<calc>1+2</calc>", "<calc>2+3</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.r.xlen(keys.inbox(THERE)))
    ((_, fields),) = await rig.r.xrange(keys.inbox(THERE))
    moved = decode_trajectory(fields[b"task"])
    calc1, calc2, res = (tok.encode("<calc>1+2</calc>"), tok.encode("<calc>2+3</calc>"),
                         tok.encode("<res>3</res>"))
    assert moved.token_ids == tok.encode_prompt("Q:1+2=") + calc1 + res + calc2 + res
    assert (moved.num_turns, moved.num_migrations, len(rig.scheduler.tool_returns)) == (2, 1, 2)
    assert await rig.load() == {HERE: 0, THERE: 1}


async def test_move_back_here_cancels_a_pending_move(rig: Rig) -> None:
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.scheduler.move_to(HERE)

    async def release_decision_in_second_call() -> None:
        if len(rig.tools.calls) == 2:
            rig.scheduler.gate.set()
            await wait_until(lambda: rig.scheduler.num_answered == 1)

    rig.tools.on_execute = release_decision_in_second_call
    rig.engine.queue("<calc>1+2</calc>", "<calc>2+3</calc>", "<ans>5</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert (traj.num_turns, traj.num_migrations) == (3, 0)
    assert await rig.r.xlen(keys.inbox(THERE)) == 0


async def test_handoff_of_a_trajectory_no_longer_assigned_here_is_refused(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task(), assign=False)  # re-queued by the scheduler meanwhile
    rig.start()
    await wait_until(lambda: rig.scheduler.num_answered == 1)
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.r.xlen(keys.inbox(THERE)) == 0 and await rig.num_published() == 0
    assert rig.core.num_moves_handed_off == 0
    assert await rig.r.hgetall(keys.counters(JOB)) == {}


async def test_handoff_from_a_stale_lease_epoch_is_refused(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.r.hset(keys.lease(HERE), "epoch", rig.coordinator.epoch + 1)
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.scheduler.num_answered == 1)
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.r.xlen(keys.inbox(THERE)) == 0
    assert await rig.r.hget(keys.assignments(JOB), "tr-0") == HERE.encode()


# -- weights -------------------------------------------------------------------------------

async def test_weights_are_loaded_on_first_task_after_checksum(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert rig.engine.loaded == [(str(rig.tmp / "v0.safetensors"), 0)]
    assert rig.core.policy_version == 0


async def test_bad_checksum_is_not_loaded_and_reported_once(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    await rig.write_weights(1, sha256="0" * 64)
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    await rig.run_until_published(2)  # many loop passes later
    (event,) = await rig.events("weights_checksum_mismatch")
    assert (event[b"version"], event[b"instance"]) == (b"1", HERE.encode())
    assert rig.engine.policy_version == 0 and [v for _, v in rig.engine.loaded] == [0]


async def test_missing_weights_file_is_reported_and_the_core_keeps_serving(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    await rig.r.hset(keys.policy(JOB), mapping={"version": 1, "sha256": "ab" * 32,
                                                 "weights_path": str(rig.tmp / "gone")})
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    await rig.run_until_published(2)
    assert rig.engine.policy_version == 0 and not rig.task.done()


async def test_newer_policy_is_loaded_between_engine_calls(rig: Rig) -> None:
    async def publish_v1() -> None:
        await rig.write_weights(1)

    rig.tools.on_execute = publish_v1
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert rig.engine.calls == [("load", 0), ("generate", 0), ("load", 1), ("generate", 1)]
    pairs = zip(traj.token_versions, traj.loss_mask, strict=True)
    assert sorted({v for v, m in pairs if m}) == [0, 1]
    assert traj.min_version == 0


async def _interrupted_answer(rig: Rig) -> t.Trajectory:
    """``<ans>3</ans>``: its first 2 tokens sampled on v0, interrupted by v1, the rest
    (``</ans>``) on v1."""
    rig.engine.queue(BlockUntilAbort("<ans>3</ans>", keep=2), "</ans>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.engine.requests)
    await rig.write_weights(1)  # the watcher aborts the engine call in flight
    (traj,) = await rig.run_until_published()
    return traj


async def test_new_policy_interrupts_the_engine_call_in_flight(rig: Rig) -> None:
    await _interrupted_answer(rig)
    assert rig.engine.num_aborts == 1
    assert rig.engine.calls == [("load", 0), ("generate", 0), ("load", 1), ("generate", 1)]


async def test_interrupted_turn_resumes_on_new_weights_with_the_rest_of_its_budget(
        rig: Rig) -> None:
    await _interrupted_answer(rig)
    first, second = rig.engine.requests
    assert second.prompt_token_ids[len(first.prompt_token_ids):] == (
        rig.engine.tokenizer.encode("<ans>3</ans>")[:2])
    assert second.max_new_tokens == first.max_new_tokens - 2


async def test_interrupted_turn_counts_once_keeps_both_versions_and_parses_whole(
        rig: Rig) -> None:
    traj = await _interrupted_answer(rig)
    assert (traj.num_turns, traj.final_text, traj.status) == (1, "3", t.TrajectoryStatus.FINISHED)
    model_versions = [v for v, m in zip(traj.token_versions, traj.loss_mask, strict=True) if m]
    assert model_versions[:2] == [0, 0] and set(model_versions[2:]) == {1}
    assert traj.check_aligned() is None


async def _publish_manifest(rig: Rig, version: int, data: bytes) -> Path:
    from libra.weight_sync import write_manifest

    weights = rig.tmp / f"v{version:06d}.safetensors"
    weights.write_bytes(data)
    manifest, digest = write_manifest(weights, version, chunk_bytes=4)
    await rig.r.hset(keys.policy(JOB), mapping={
        "version": version, "weights_path": str(manifest), "sha256": digest,
        "model_dir": str(rig.tmp / "model"), "published_at_ms": 0})
    return weights


async def test_manifest_version_is_loaded_whole_and_its_reload_time_recorded(rig: Rig) -> None:
    await _publish_manifest(rig, 1, b"weights v1 bytes")
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert rig.engine.loaded == [("weights v1 bytes", 1)]
    (event,) = await rig.events("weights_loaded")
    assert event[b"version"] == b"1" and float(event[b"reload_s"]) >= 0.0


async def test_corrupt_chunk_is_an_error_event_and_the_old_weights_keep_serving(
        rig: Rig) -> None:
    rig.tools.gate = asyncio.Event()  # hold the trajectory in its tool call
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    weights = await _publish_manifest(rig, 1, b"weights v1 bytes")
    weights.write_bytes(b"weights v1 bytez")  # corrupted after the manifest was written
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    rig.tools.gate.set()
    (traj,) = await rig.run_until_published()
    (event,) = await rig.events("weights_checksum_mismatch")
    assert b"chunk 3" in event[b"error"]
    assert rig.engine.policy_version == 0 and set(traj.token_versions) == {-1, 0}


async def test_fetch_past_the_deadline_is_an_error_event_not_a_hang(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import time

    import services.rollout.core as rollout_core

    monkeypatch.setattr(rollout_core, "read_verified", lambda *_: time.sleep(1.0) or b"")
    rig.core.settings = dataclasses.replace(rig.core.settings, weight_load_deadline_s=0.05)
    await _publish_manifest(rig, 1, b"weights v1 bytes")
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    (event,) = await rig.events("weights_load_timeout")
    assert event[b"version"] == b"1"


# -- job end and lease ---------------------------------------------------------------------

async def _cancel_while_in_tool_call(rig: Rig) -> None:
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    await rig.r.hset(keys.job(JOB), "state", "cancelled")
    await wait_until(lambda: rig.core.num_active == 0)


async def test_cancelled_job_drops_active_work_and_acks_it(rig: Rig) -> None:
    await _cancel_while_in_tool_call(rig)
    assert await rig.inbox_pending() == 0 and rig.core.job_id == ""


async def test_tool_return_after_cancel_is_neither_published_nor_handed_off(rig: Rig) -> None:
    await _cancel_while_in_tool_call(rig)
    rig.scheduler.move_to(THERE)
    rig.tools.gate.set()
    await wait_until(lambda: rig.scheduler.tool_returns)
    await asyncio.sleep(0.05)  # let the tool task finish what it would do
    assert await rig.r.xlen(keys.inbox(THERE)) == 0
    assert await rig.num_published() == 0


async def test_lost_lease_drops_work_and_registers_again(rig: Rig) -> None:
    rig.core.settings = RolloutSettings(instance_id=HERE, bucket="short", lease_ttl_ms=30,
                                        idle_block_ms=5)
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)  # pinned here, in its tool call
    rig.coordinator.lose_lease_times = 1
    await wait_until(lambda: len(rig.coordinator.acquired) == 2)
    assert rig.core.num_active == 0
    rig.tools.gate.set()
    await wait_until(lambda: rig.scheduler.tool_returns)
    await asyncio.sleep(0.05)
    assert await rig.num_published() == 0


async def test_drain_releases_the_lease(rig: Rig) -> None:
    rig.start()
    await rig.core.drain(0.0)
    await asyncio.wait_for(rig.task, 1.0)
    assert rig.coordinator.released == [(HERE, 1)]


async def test_engine_is_loaded_with_the_tp_degree_of_this_instances_bucket(
        rig: Rig) -> None:
    spec = JobSpec(layout=LayoutSpec(buckets=[BucketSpec(name="short", max_tokens=96,
                                                         tp_degree=2),
                                              BucketSpec(name="long", max_tokens=256,
                                                         tp_degree=4)]))
    await rig.r.hset(keys.job(JOB), "spec_json", spec.to_json())
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert rig.core._loader.tp_degrees == [2]


async def test_tool_calls_carry_the_jobs_tool_settings(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    call = rig.tools.calls[0]
    assert (call["tool"], call["args"]) == ("calculator", {"expression": "1+2"})
    assert call["options"] == {"transient_failure_rate": 0.25}
