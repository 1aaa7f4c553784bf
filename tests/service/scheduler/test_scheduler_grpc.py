"""The scheduler servicer over real gRPC and a real Redis: batched tool-return reports on
one stream (per-item errors, refused batches, a restarted scheduler), fencing by lease
epoch."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clients.runner import GrpcSchedulerClient
from libra.clients.scheduler import IMPLIED_STAY
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from libra.jobspec import JobSpec
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra_cli.redis_server import EmbeddedRedis
from services.scheduler.core import SchedulerCore
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore
from tests.service.grpc_harness import serving
from tests.waiting import wait_until

STATE = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
EPOCH = 7


async def _job_and_lease(redis_server: EmbeddedRedis) -> aioredis.Redis:
    """A clean Redis with job j1 running and rollout-0 holding a lease at EPOCH."""
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    await r.flushdb()
    await r.hset(keys.job("j1"), mapping={"spec_json": JobSpec().to_json(), "state": "running"})
    await r.sadd(keys.WORKERS, "rollout-0")
    await r.hset(keys.lease("rollout-0"), mapping={"role": "core-rollout", "bucket": "short",
                                                   "epoch": EPOCH})
    return r


@pytest.fixture
async def client(redis_server: EmbeddedRedis):
    r = await _job_and_lease(redis_server)
    async with _scheduler(r) as address:
        c = GrpcSchedulerClient(address)
        yield c
        await c.close()
    await r.aclose()


def _scheduler(r: aioredis.Redis, port: int = 0):  # noqa: ANN202
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    return serving("scheduler", scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                   SchedulerServicer(core), scheduler_pb2.DESCRIPTOR, "SchedulerService",
                   port)


async def test_start_job_then_stats_name_the_policy(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    stats = await client.stats("j1")
    assert stats["policy"] == JobSpec().layout.policy


async def test_unknown_job_is_not_found(client: GrpcSchedulerClient) -> None:
    with pytest.raises(NotFound):
        await client.start_job("nope")


async def test_tool_return_for_a_job_not_scheduled_fails_precondition(
        client: GrpcSchedulerClient) -> None:
    with pytest.raises(FailedPrecondition, match="not being scheduled"):
        await client.report_tool_return("j1", "traj", STATE, 3, "rollout-0", EPOCH)


async def test_tool_return_of_unknown_trajectory_stays(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    decision = await client.report_tool_return("j1", "traj", STATE, 3, "rollout-0", EPOCH)
    assert decision.action is t.DecisionAction.STAY
    assert decision.reason == "unknown_trajectory"
    await client.report_finished("j1", "traj", 10, t.TrajectoryStatus.FINISHED, "rollout-0",
                                 EPOCH)


async def test_concurrent_reports_share_one_batch(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    decisions = await asyncio.gather(*(
        client.report_tool_return("j1", f"traj-{i}", STATE, 3, "rollout-0", EPOCH)
        for i in range(5)))
    assert [d.reason for d in decisions] == ["unknown_trajectory"] * 5
    assert client.num_report_batches == 1


async def test_reports_within_the_linger_share_one_batch(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    # The linger ends when the test says, not after 0.2 s of a clock that a loaded
    # machine can stall past the reports' 20 ms spacing.
    linger_over = asyncio.Event()
    lingered_s: list[float] = []

    async def linger(seconds: float) -> None:
        lingered_s.append(seconds)
        await linger_over.wait()

    lingering = GrpcSchedulerClient(client.address, linger_s=0.2, sleep=linger)

    async def report_later(index: int) -> t.PlacementDecision:
        await asyncio.sleep(0.02 * index)  # apart in time, within the linger
        return await lingering.report_tool_return("j1", f"traj-{index}", STATE, 3,
                                                  "rollout-0", EPOCH)

    reports = asyncio.gather(*(report_later(i) for i in range(3)))
    await wait_until(lambda: lingering.num_reports == 3)
    linger_over.set()
    decisions = await reports
    await lingering.close()
    assert lingered_s == [0.2]
    assert [d.reason for d in decisions] == ["unknown_trajectory"] * 3
    assert (lingering.num_reports, lingering.num_report_batches) == (3, 1)


async def test_an_item_of_a_job_not_scheduled_fails_alone(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    ok, bad = await asyncio.gather(
        client.report_tool_return("j1", "traj-0", STATE, 3, "rollout-0", EPOCH),
        client.report_tool_return("other-job", "traj-1", STATE, 3, "rollout-0", EPOCH),
        return_exceptions=True)
    assert isinstance(ok, t.PlacementDecision) and ok.reason == "unknown_trajectory"
    assert isinstance(bad, FailedPrecondition) and "other-job" in str(bad)
    assert client.num_report_batches == 1


async def test_report_with_a_stale_epoch_is_refused_naming_the_epoch(
        client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    with pytest.raises(FailedPrecondition, match="stale lease epoch 6 .*current epoch 7"):
        await client.report_tool_return("j1", "traj", STATE, 3, "rollout-0", EPOCH - 1)


async def test_batch_with_a_stale_epoch_is_refused_whole(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    results = await asyncio.gather(*(
        client.report_tool_return("j1", f"traj-{i}", STATE, 3, "rollout-0", EPOCH - 1)
        for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, FailedPrecondition) for r in results)


async def test_a_refused_batch_leaves_the_stream_open(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    with pytest.raises(FailedPrecondition, match="stale lease epoch"):
        await client.report_tool_return("j1", "traj-0", STATE, 3, "rollout-0", EPOCH - 1)
    decision = await client.report_tool_return("j1", "traj-1", STATE, 3, "rollout-0", EPOCH)
    assert decision.reason == "unknown_trajectory"
    assert (client.num_report_batches, client.num_report_streams) == (2, 1)


async def _written(client: GrpcSchedulerClient, batches: int) -> None:
    while client.num_report_batches < batches:
        await asyncio.sleep(0.005)


def _quiet_report(client: GrpcSchedulerClient, trajectory_id: str,
                  ) -> asyncio.Task[t.PlacementDecision]:
    """A report whose stay needs no answer of its own (as the rollout makes them)."""
    return asyncio.create_task(client.report_tool_return(
        "j1", trajectory_id, STATE, 3, "rollout-0", EPOCH, needs_answer=False))


async def test_a_stay_that_needs_no_answer_is_settled_by_a_later_answer(
        client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    quiet = _quiet_report(client, "traj-0")
    await _written(client, 1)
    asked = await client.report_tool_return("j1", "traj-1", STATE, 3, "rollout-0", EPOCH)
    assert asked.reason == "unknown_trajectory"
    assert (await quiet).reason == IMPLIED_STAY
    # The stream is ordered: the first batch was read before the second was answered,
    # and one answer came for two batches, so the first got none of its own.
    assert (client.num_report_batches, client.num_report_answers) == (2, 1)


async def test_the_batch_that_fills_the_window_is_answered(
        client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    windowed = GrpcSchedulerClient(client.address, max_unanswered=2)
    quiet = []
    for i in range(3):
        quiet.append(_quiet_report(windowed, f"traj-{i}"))
        await _written(windowed, i + 1)
    decisions = await asyncio.gather(*quiet)
    assert [d.reason for d in decisions] == [IMPLIED_STAY, IMPLIED_STAY, "unknown_trajectory"]
    assert (windowed.num_report_batches, windowed.num_report_answers) == (3, 1)
    await windowed.close()


async def test_a_full_window_waits_for_room_not_for_its_own_answer(
        client: GrpcSchedulerClient) -> None:
    """Two batches out at once, the first refused (answered), the second a stay: the
    window of one is full until the first answer is read, and then has room; the
    scheduler owes the second no answer, so waiting for one would stall the sender."""
    await client.start_job("j1")
    windowed = GrpcSchedulerClient(client.address, timeout_s=1.0, max_unanswered=1)
    refused, quiet = (asyncio.create_task(windowed.report_tool_return(
        "j1", "traj-0", STATE, 3, "rollout-0", epoch, needs_answer=False))
        for epoch in (EPOCH - 1, EPOCH))  # one batch per epoch, both queued now
    with pytest.raises(FailedPrecondition):
        await refused
    asked = await windowed.report_tool_return("j1", "traj-1", STATE, 3, "rollout-0", EPOCH)
    assert asked.reason == "unknown_trajectory"
    assert (await quiet).reason == IMPLIED_STAY
    assert (windowed.num_report_batches, windowed.num_report_answers) == (3, 2)
    await windowed.close()


async def test_closing_the_client_settles_its_unanswered_stays(
        client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    quiet = _quiet_report(client, "traj-0")
    await _written(client, 1)
    await client.close()  # the scheduler answers the last batch as the stream ends
    assert (await quiet).reason == "unknown_trajectory"


async def test_reports_go_on_after_a_scheduler_restart(redis_server: EmbeddedRedis) -> None:
    r = await _job_and_lease(redis_server)
    async with _scheduler(r) as address:
        client = GrpcSchedulerClient(address, timeout_s=2.0)
        await client.start_job("j1")
        await client.report_tool_return("j1", "traj-0", STATE, 3, "rollout-0", EPOCH)
        # A stay that needs no answer is out, unanswered, when the scheduler stops.
        quiet = _quiet_report(client, "traj-q")
        await _written(client, 2)
        await asyncio.sleep(0.1)
        assert not quiet.done()
    # It is settled, never left pending: a stay, or the stream's error (read as a stay).
    (outcome,) = await asyncio.wait_for(asyncio.gather(quiet, return_exceptions=True), 2.0)
    assert isinstance(outcome, Unavailable) or outcome.reason == "unknown_trajectory"
    # The stream ended with the scheduler: the next report opens a new one.
    async with _scheduler(r, port=int(address.rsplit(":", 1)[1])):
        await client.start_job("j1")
        decision = await client.report_tool_return("j1", "traj-1", STATE, 3, "rollout-0",
                                                   EPOCH)
    assert decision.reason == "unknown_trajectory"
    assert client.num_report_streams == 2
    # No scheduler at all: the report fails (the rollout stays), it does not hang.
    with pytest.raises(Unavailable):
        await client.report_tool_return("j1", "traj-2", STATE, 3, "rollout-0", EPOCH)
    await client.close()
    await r.aclose()


async def test_report_without_a_live_lease_is_refused(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    with pytest.raises(FailedPrecondition, match="no live lease"):
        await client.report_tool_return("j1", "traj", STATE, 3, "rollout-9", 1)


async def test_finish_report_with_a_stale_epoch_is_refused(
        client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    with pytest.raises(FailedPrecondition, match="stale lease epoch 3"):
        await client.report_finished("j1", "traj", 10, t.TrajectoryStatus.FINISHED,
                                     "rollout-0", 3)


@pytest.mark.parametrize("instance_id", ["", "rollout\n0", "r" * 300])
async def test_a_bad_instance_id_is_invalid_argument_not_a_stale_lease(
        client: GrpcSchedulerClient, instance_id: str) -> None:
    await client.start_job("j1")
    with pytest.raises(InvalidArgument) as info:
        await client.report_finished("j1", "traj", 10, t.TrajectoryStatus.FINISHED,
                                     instance_id, EPOCH)
    assert info.value.field == "instance_id"
