"""The in-process rollout client answers as the gRPC client does, over one core served
on a real gRPC socket: the same status, the same leases, the same errors (type, field,
message) for the failure paths a caller meets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.clients.rollout import GrpcRolloutClient, RolloutApi
from libra.errors import LibraError
from libra.limits import MAX_GENERATION_AHEAD_MS
from libra.proto.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from services.rollout.inprocess import InProcessRolloutClient
from services.rollout.servicer import RolloutServicer
from tests.service.grpc_harness import serving
from tests.unit.rollout.lend_fakes import FakeHybridTrainer, Opener
from tests.unit.rollout.rig import JOB, Rig, started_rig


@pytest.fixture
async def clients(tmp_path: Path) -> AsyncIterator[tuple[Rig, RolloutApi, RolloutApi]]:
    async with started_rig(tmp_path, bucket="long", role=t.WorkerRole.HYBRID_ROLLOUT,
                           opener=Opener(), load_trainer=FakeHybridTrainer) as rig:
        async with serving("rollout", rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
                           RolloutServicer(rig.core), rollout_pb2.DESCRIPTOR,
                           "RolloutService") as address:
            grpc_client = GrpcRolloutClient(address, timeout_s=5.0)
            try:
                yield rig, grpc_client, InProcessRolloutClient(rig.core)
            finally:
                await grpc_client.close()


async def error_of(call) -> LibraError:  # noqa: ANN001
    with pytest.raises(LibraError) as caught:
        await call
    return caught.value


async def test_status_is_the_same(clients) -> None:  # noqa: ANN001
    _, over_grpc, in_process = clients
    assert await over_grpc.get_instance_status() == await in_process.get_instance_status()


async def test_errors_are_the_same(clients) -> None:  # noqa: ANN001
    rig, over_grpc, in_process = clients
    stale = rig.core.lease.epoch - 1
    forged = rig.clock.now_ms() + MAX_GENERATION_AHEAD_MS + 1
    for call in (lambda c: c.lend(JOB, stale, 1, "trainer:1"),
                 lambda c: c.reclaim(forged, "test")):
        via_grpc, via_call = await error_of(call(over_grpc)), await error_of(call(in_process))
        assert (type(via_grpc), str(via_grpc)) == (type(via_call), str(via_call))
        assert getattr(via_grpc, "field", None) == getattr(via_call, "field", None)


async def test_lend_and_reclaim_leases_are_the_same(clients) -> None:  # noqa: ANN001
    rig, over_grpc, in_process = clients
    lent = await in_process.lend(JOB, rig.core.lease.epoch, 1, "trainer:1")
    assert lent.lease == rig.core.lease
    back = await over_grpc.reclaim(2, "test")
    assert back == rig.core.lease and back.role is t.WorkerRole.HYBRID_ROLLOUT
    lent = await over_grpc.lend(JOB, rig.core.lease.epoch, 3, "trainer:1")
    assert lent.lease == rig.core.lease
    assert await in_process.reclaim(4, "test") == rig.core.lease
