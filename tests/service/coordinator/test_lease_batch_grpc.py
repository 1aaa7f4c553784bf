"""RenewLeases over real gRPC: the coordinator servicer and core (``libra.grpcx.Server``
on port 0, its error interceptor) on ``RedisCoordinatorStore`` over the session's
redis-server, called through the typed ``GrpcCoordinatorClient`` and, for what the
client would not send, a raw stub. Fakes: ``FakeRunner`` for the trainer and scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from libra import redis_keys as keys
from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import LeaseLost
from libra.grpcx import insecure_channel
from libra.limits import MAX_LEASES_PER_RENEWAL
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner
from tests.service.grpc_harness import serving


@pytest.fixture
async def address(redis: Any, tmp_path: Path) -> AsyncIterator[str]:
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    async with serving("coordinator", pb_grpc.add_CoordinatorServiceServicer_to_server,
                       CoordinatorServicer(core), pb.DESCRIPTOR,
                       "CoordinatorService") as addr:
        yield addr


@pytest.fixture
async def client(address: str) -> AsyncIterator[GrpcCoordinatorClient]:
    c = GrpcCoordinatorClient(address, timeout_s=30.0)
    yield c
    await c.close()


async def acquire(client: GrpcCoordinatorClient, worker_id: str, ttl_ms: int) -> t.Lease:
    return await client.acquire_lease(worker_id, t.WorkerRole.CORE_ROLLOUT, "short",
                                      "127.0.0.1:1", ttl_ms)


async def test_one_call_renews_the_held_leases_and_reports_lapsed_and_foreign_ones(
        client: GrpcCoordinatorClient, redis: Any) -> None:
    live = await acquire(client, "live", 10_000)
    lapsed = await acquire(client, "lapsed", 10_000)
    await redis.delete(keys.lease("lapsed"))  # its TTL ran out (deterministically)
    stale = await acquire(client, "foreign", 10_000)
    current = await acquire(client, "foreign", 10_000)  # another holder took the id
    await redis.pexpire(keys.lease("live"), 2_000)  # so a renewal visibly extends it
    renewals = await client.renew_leases([t.LeaseRef("live", live.epoch),
                                          t.LeaseRef("lapsed", lapsed.epoch),
                                          t.LeaseRef("foreign", stale.epoch)])
    assert [(r.worker_id, r.epoch, r.outcome) for r in renewals] == [
        ("live", live.epoch, t.RenewOutcome.RENEWED),
        ("lapsed", lapsed.epoch, t.RenewOutcome.GONE),
        ("foreign", stale.epoch, t.RenewOutcome.FENCED)]
    assert renewals[0].lease_or_raise().ttl_ms == 10_000
    assert await redis.pttl(keys.lease("live")) > 5_000
    for lost in renewals[1:]:
        with pytest.raises(LeaseLost):
            lost.lease_or_raise()
    # Fencing unchanged: the foreign holder's lease keeps its epoch; the single-lease
    # RPC still answers as before.
    assert (await client.renew_lease("foreign", current.epoch)).epoch == current.epoch
    with pytest.raises(LeaseLost):
        await client.renew_lease("foreign", stale.epoch)


async def test_an_empty_batch_answers_nothing(client: GrpcCoordinatorClient,
                                              address: str) -> None:
    assert await client.renew_leases([]) == []  # the client sends no call at all
    async with insecure_channel(address) as channel:  # and the server answers one
        resp = await pb_grpc.CoordinatorServiceStub(channel).RenewLeases(
            pb.RenewLeasesRequest(), timeout=10)
    assert list(resp.renewals) == []


async def test_an_oversize_batch_is_invalid_argument_naming_leases(address: str) -> None:
    request = pb.RenewLeasesRequest(leases=[pb.LeaseRef(worker_id=f"w{i}", epoch=1)
                                            for i in range(MAX_LEASES_PER_RENEWAL + 1)])
    async with insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.CoordinatorServiceStub(channel).RenewLeases(request, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("leases: ")


async def test_a_repeated_worker_is_invalid_argument_naming_its_place(address: str) -> None:
    request = pb.RenewLeasesRequest(leases=[pb.LeaseRef(worker_id="w", epoch=1),
                                            pb.LeaseRef(worker_id="w", epoch=2)])
    async with insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await pb_grpc.CoordinatorServiceStub(channel).RenewLeases(request, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("leases[1].worker_id: ")


async def test_the_client_splits_a_larger_set_into_calls_the_server_takes(
        client: GrpcCoordinatorClient) -> None:
    held = await asyncio.gather(*(acquire(client, f"h{i}", 10_000) for i in range(3)))
    refs = [t.LeaseRef(f"ghost{i}", 1) for i in range(MAX_LEASES_PER_RENEWAL)]
    refs[500:500] = [t.LeaseRef(x.worker_id, x.epoch) for x in held]
    renewals = await client.renew_leases(refs)
    assert [r.worker_id for r in renewals] == [r.worker_id for r in refs]
    assert [r.outcome for r in renewals[500:503]] == [t.RenewOutcome.RENEWED] * 3
    assert {r.outcome for r in renewals[:500] + renewals[503:]} == {t.RenewOutcome.GONE}
