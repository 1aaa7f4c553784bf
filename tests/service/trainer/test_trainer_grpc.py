"""The trainer servicer over real gRPC and a real Redis (fake torch backend)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra.clients.runner import GrpcTrainerClient
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, NotFound
from libra.jobspec import JobSpec
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from libra_cli.redis_server import EmbeddedRedis
from services.trainer.core import TrainerCore
from services.trainer.servicer import TrainerServicer
from services.trainer.store import RedisTrainerStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.trainer_backend import FakeBackendFactory
from tests.service.grpc_harness import serving
from tests.waiting import wait_until


@pytest.fixture
async def client(redis_server: EmbeddedRedis, tmp_path):
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    await r.flushdb()
    await r.hset(keys.job("j1"), mapping={"spec_json": JobSpec().to_json(), "state": "running",
                                          "run_dir": str(tmp_path)})
    core = TrainerCore(RedisTrainerStore(r), FakeBackendFactory(), FakeCoordinator(),
                       FakeClock(), block_ms=20)
    async with serving("trainer", trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
                       TrainerServicer(core), trainer_pb2.DESCRIPTOR,
                       "TrainerService") as address:
        c = GrpcTrainerClient(address)
        yield c
        await core.drain(0)
        await c.close()
    await r.aclose()


async def test_idle_trainer_reports_idle(client: GrpcTrainerClient) -> None:
    status = await client.status()
    assert (status.job_id, status.phase, status.message) == ("", "idle", "")


async def test_start_unknown_job_is_not_found(client: GrpcTrainerClient) -> None:
    with pytest.raises(NotFound):
        await client.start_job("nope")


async def test_second_job_while_busy_fails_precondition(client: GrpcTrainerClient) -> None:
    await client.start_job("j1")
    with pytest.raises(FailedPrecondition):
        await client.start_job("j1")
    status = await client.status()
    assert status.job_id == "j1" and status.is_working_on("j1")
    await client.stop_job("j1")
    assert (await client.status()).phase == "idle"


async def test_start_with_resume_takes_the_job_up_as_a_resume(
        client: GrpcTrainerClient, redis_server: EmbeddedRedis) -> None:
    # The coordinator's reconciliation uses this for a RUNNING job no trainer holds.
    await client.start_job("j1", resume=True)
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    await wait_until(lambda: r.xlen(keys.events("j1")), timeout_s=10.0)
    kinds = [fields["kind"] for _, fields in await r.xrange(keys.events("j1"))]
    assert kinds == ["trainer_resumed"]
    await r.aclose()
