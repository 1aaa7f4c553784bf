"""The scheduler servicer over real gRPC and a real Redis: batched tool-return reports
(per-item errors), fencing by lease epoch, decisions counted and traced."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clients.runner import GrpcSchedulerClient
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, NotFound
from libra.jobspec import JobSpec
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.redis_server import EmbeddedRedis
from services.scheduler.core import SchedulerCore
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore
from tests.service.grpc_harness import serving

STATE = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
EPOCH = 7


@pytest.fixture
async def client(redis_server: EmbeddedRedis):
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    await r.flushdb()
    await r.hset(keys.job("j1"), mapping={"spec_json": JobSpec().to_json(), "state": "running"})
    await r.sadd(keys.WORKERS, "rollout-0")
    await r.hset(keys.lease("rollout-0"), mapping={"role": "core-rollout", "bucket": "short",
                                                   "epoch": EPOCH})
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    async with serving("scheduler", scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                       SchedulerServicer(core), scheduler_pb2.DESCRIPTOR,
                       "SchedulerService") as address:
        c = GrpcSchedulerClient(address)
        yield c
        await c.close()
    await r.aclose()


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


async def test_concurrent_reports_share_one_rpc(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    decisions = await asyncio.gather(*(
        client.report_tool_return("j1", f"traj-{i}", STATE, 3, "rollout-0", EPOCH)
        for i in range(5)))
    assert [d.reason for d in decisions] == ["unknown_trajectory"] * 5
    assert client.num_report_rpcs == 1


async def test_reports_within_the_linger_share_one_rpc(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    lingering = GrpcSchedulerClient(client.address, linger_s=0.2)

    async def report_later(index: int) -> t.PlacementDecision:
        await asyncio.sleep(0.02 * index)  # apart in time, within the linger
        return await lingering.report_tool_return("j1", f"traj-{index}", STATE, 3,
                                                  "rollout-0", EPOCH)

    decisions = await asyncio.gather(*(report_later(i) for i in range(3)))
    await lingering.close()
    assert [d.reason for d in decisions] == ["unknown_trajectory"] * 3
    assert (lingering.num_reports, lingering.num_report_rpcs) == (3, 1)


async def test_an_item_of_a_job_not_scheduled_fails_alone(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    ok, bad = await asyncio.gather(
        client.report_tool_return("j1", "traj-0", STATE, 3, "rollout-0", EPOCH),
        client.report_tool_return("other-job", "traj-1", STATE, 3, "rollout-0", EPOCH),
        return_exceptions=True)
    assert isinstance(ok, t.PlacementDecision) and ok.reason == "unknown_trajectory"
    assert isinstance(bad, FailedPrecondition) and "other-job" in str(bad)
    assert client.num_report_rpcs == 1


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
