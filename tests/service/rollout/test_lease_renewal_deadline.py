"""A renewal stuck on a coordinator that never answers fails while the lease still lives,
and is tried again (``libra/lease_timing.py``: ``renewal_deadline_s``).

Before, a renewal carried the client's default deadline (10 s) whatever the lease's TTL:
a 3 s lease had expired long before the stuck call failed and the retry came. Real gRPC
over a socket: a coordinator that grants leases and takes every RenewLease without
answering, and the rollout's ``LeaseKeeper`` over ``GrpcCoordinatorClient``. What is
checked is the deadline each renewal carries (the server reads it off the call) and the
order of attempts and their ends, never how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.lease_timing import RENEWAL_DEADLINE_MIN_S, renewal_deadline_s
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra.wire.common import lease_to_proto
from services.rollout.lease_keeper import LeaseKeeper
from services.rollout.loop_types import LeaseHolder, RolloutSettings
from services.rollout.memory_store import MemoryRolloutStore
from tests.service.grpc_harness import serving
from tests.waiting import wait_until

TTL_MS = 3_000
CLIENT_DEFAULT_TIMEOUT_S = 10.0


@dataclass
class SilentRenewals(pb_grpc.CoordinatorServiceServicer):
    """Grants leases; takes each RenewLease and never answers it (a coordinator stuck
    under load). ``events``: ("renew", deadline_s) when a renewal arrives, ("ended", 0)
    when its caller gave up on it (the call cancelled at its deadline)."""

    events: list[tuple[str, float]] = field(default_factory=list)

    async def AcquireLease(self, request: Any, context: Any) -> Any:  # noqa: N802
        lease = t.Lease(t.WorkerId(request.worker_id), t.WorkerRole.CORE_ROLLOUT,
                        request.bucket, request.address, 1, 0, request.ttl_ms)
        return pb.AcquireLeaseResponse(lease=lease_to_proto(lease))

    async def RenewLease(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.events.append(("renew", context.time_remaining()))
        try:
            await asyncio.Event().wait()
        finally:
            self.events.append(("ended", 0.0))


async def _nothing_to_drop() -> None:
    return None


@pytest.fixture
async def silent() -> AsyncIterator[tuple[str, SilentRenewals]]:
    servicer = SilentRenewals()
    async with serving("coordinator", pb_grpc.add_CoordinatorServiceServicer_to_server,
                       servicer, pb.DESCRIPTOR, "CoordinatorService") as address:
        yield address, servicer


async def test_a_hung_renewal_fails_within_the_lease_and_is_tried_again(
        silent: tuple[str, SilentRenewals]) -> None:
    address, server = silent
    client = GrpcCoordinatorClient(address, timeout_s=CLIENT_DEFAULT_TIMEOUT_S)
    keeper = LeaseKeeper(RolloutSettings(instance_id="rollout-0", bucket="short",
                                         lease_ttl_ms=TTL_MS),
                         MemoryRolloutStore(), client, LeaseHolder(), _nothing_to_drop)
    stopping = asyncio.Event()
    await keeper.register()
    task = asyncio.create_task(keeper.heartbeat(stopping.is_set))
    try:
        await wait_until(lambda: [kind for kind, _ in server.events][:3]
                         == ["renew", "ended", "renew"])
    finally:
        stopping.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
    deadlines_s = [deadline_s for kind, deadline_s in server.events if kind == "renew"]
    # The first renewal comes a third of the TTL after the grant: it may take half of
    # the two thirds left, never the client's 10 s (the lease would be long gone).
    assert deadlines_s[0] <= TTL_MS / 3000
    assert all(d <= TTL_MS / 1000 for d in deadlines_s)


def test_the_deadline_is_half_the_time_the_lease_has_left() -> None:
    assert renewal_deadline_s(3_000, 1.0) == pytest.approx(1.0)
    assert renewal_deadline_s(12_000, 0.0) == pytest.approx(6.0)
    # Nearly or already expired (by the holder's reckoning): still time for one answer.
    assert renewal_deadline_s(3_000, 2.9) == RENEWAL_DEADLINE_MIN_S
    assert renewal_deadline_s(3_000, 30.0) == RENEWAL_DEADLINE_MIN_S
