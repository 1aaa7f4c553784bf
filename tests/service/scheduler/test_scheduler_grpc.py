"""The scheduler servicer over real gRPC and a real Redis."""

from __future__ import annotations

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


@pytest.fixture
async def client(redis_server: EmbeddedRedis):
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    await r.flushdb()
    await r.hset(keys.job("j1"), mapping={"spec_json": JobSpec().to_json(), "state": "running"})
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
    with pytest.raises(FailedPrecondition):
        await client.report_tool_return("j1", "traj", STATE, 3, "rollout-0")


async def test_tool_return_of_unknown_trajectory_stays(client: GrpcSchedulerClient) -> None:
    await client.start_job("j1")
    decision = await client.report_tool_return("j1", "traj", STATE, 3, "rollout-0")
    assert decision.action is t.DecisionAction.STAY
    await client.report_finished("j1", "traj", 10, t.TrajectoryStatus.FINISHED, "rollout-0")
