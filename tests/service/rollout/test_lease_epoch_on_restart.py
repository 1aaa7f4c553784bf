"""A restarted rollout instance takes its lease once: one grant, one fence increment.

Seen in the stack (tests/integration/test_scheduler_restart_while_down.py): rollout-0's
epoch went 1 -> 3 over a restart, which looked like two grants. It is one: the epoch is
the global fence counter (``libra:fence``, incremented by every grant and role change of
any worker, docs/architecture.md), and the stack's other instance, rollout-1, took 2 at
start. Real parts: the coordinator's servicer and core on ``RedisCoordinatorStore`` over
the session's redis-server behind a gRPC server on port 0, and the rollout's own
registration (``LeaseKeeper.register`` over ``GrpcCoordinatorClient``, ``RedisRolloutStore``).
A restart is a new keeper registering under the same id while the old lease still lives
(SIGKILL: no release).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from libra import redis_keys as keys
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from services.rollout.lease_keeper import LeaseKeeper
from services.rollout.loop_types import LeaseHolder, RolloutSettings
from services.rollout.store import RedisRolloutStore
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


async def _nothing_to_drop() -> None:
    return None


async def start_instance(address: str, redis_bytes: Any, instance_id: str) -> int:
    """One rollout process's start-up registration; its lease epoch."""
    client = GrpcCoordinatorClient(address, timeout_s=30.0)
    keeper = LeaseKeeper(RolloutSettings(instance_id=instance_id, bucket="short",
                                         address="127.0.0.1:1", lease_ttl_ms=30_000),
                         RedisRolloutStore(redis_bytes), client, LeaseHolder(),
                         _nothing_to_drop)
    try:
        return (await keeper.register()).epoch
    finally:
        await client.close()


async def fence(redis: Any) -> int:
    return int(await redis.get(keys.FENCE) or 0)


async def test_a_restart_alone_moves_the_epoch_by_one(address: str, redis: Any,
                                                      redis_bytes: Any) -> None:
    first = await start_instance(address, redis_bytes, "rollout-0")
    restarted = await start_instance(address, redis_bytes, "rollout-0")
    assert restarted == first + 1 == await fence(redis)


async def test_another_instances_grant_in_between_is_the_second_step(
        address: str, redis: Any, redis_bytes: Any) -> None:
    """The stack's sequence: rollout-0 and rollout-1 start, rollout-0 restarts."""
    r0 = await start_instance(address, redis_bytes, "rollout-0")
    r1 = await start_instance(address, redis_bytes, "rollout-1")
    r0_again = await start_instance(address, redis_bytes, "rollout-0")
    assert (r0, r1, r0_again) == (1, 2, 3)
    assert await fence(redis) == 3  # three registrations, three grants: none hidden
