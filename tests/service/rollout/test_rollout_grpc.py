"""The rollout servicer over real gRPC: instance status as the core sees it."""

from __future__ import annotations

import redis.asyncio as aioredis

from libra.clock import FakeClock
from libra.grpcx import insecure_channel
from libra.proto.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from libra_cli.redis_server import EmbeddedRedis
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.servicer import RolloutServicer
from services.rollout.store import RedisRolloutStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.engine import FakeEngine, FakeEngineLoader, make_tokenizer
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway
from tests.service.grpc_harness import serving


async def test_instance_status_reports_identity_and_load(redis_server: EmbeddedRedis) -> None:
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    core = RolloutCore(RolloutSettings(instance_id="rollout-7", bucket="long"),
                       RedisRolloutStore(r),
                       FakeEngineLoader(FakeEngine(make_tokenizer())), FakeToolGateway(),
                       FakeScheduler(), FakeCoordinator(), FakeClock())
    async with serving("rollout", rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
                       RolloutServicer(core), rollout_pb2.DESCRIPTOR,
                       "RolloutService") as address:
        async with insecure_channel(address) as channel:
            resp = await rollout_pb2_grpc.RolloutServiceStub(channel).GetInstanceStatus(
                rollout_pb2.GetInstanceStatusRequest(), timeout=5)
    assert (resp.instance_id, resp.bucket, resp.active_trajectories) == ("rollout-7", "long", 0)
    assert resp.policy_version == -1 and resp.job_id == ""
    await r.aclose()
