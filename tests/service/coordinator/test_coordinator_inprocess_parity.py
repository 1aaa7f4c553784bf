"""The in-process coordinator client answers as the gRPC client does: one scenario of
good and bad calls, once through ``GrpcCoordinatorClient`` over a real gRPC server on a
socket and once through ``InProcessCoordinatorClient``, gives the same outcomes (results,
error classes and the fields they name).

Real: both clients, the servicer and gRPC server, the core, ``InMemoryCoordinatorStore``
(the transport is what differs; the store is the same kind on both sides). Fakes:
``FakeRunner`` for the trainer and the scheduler.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import LibraError
from libra.grpcx import Registration, Server
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra.service_config import ServerConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.inprocess import InProcessCoordinatorClient
from services.coordinator.memory_store import InMemoryCoordinatorStore
from services.coordinator.servicer import CoordinatorServicer
from tests.fakes.runner import FakeRunner

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
SPEC = 'name = "parity"\n[algorithm]\nnum_steps = 3\n'


def _core(tmp_path: Path) -> CoordinatorCore:
    clock = SystemClock()
    return CoordinatorCore(InMemoryCoordinatorStore(clock), FakeRunner(), FakeRunner(),
                           clock, tmp_path / "runs")


@pytest.fixture
async def grpc_client(tmp_path: Path) -> AsyncIterator[GrpcCoordinatorClient]:
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=2.0),
                 [Registration(pb_grpc.add_CoordinatorServiceServicer_to_server,
                               CoordinatorServicer(_core(tmp_path / "grpc")), SERVICE_NAME)])
    await srv.start()
    client = GrpcCoordinatorClient(f"127.0.0.1:{srv.port}", timeout_s=10.0)
    yield client
    await client.close()
    await srv.stop()


async def _outcome(call: Awaitable[Any]) -> Any:
    try:
        return ("ok", await call)
    except LibraError as exc:
        return ("error", type(exc).__name__, getattr(exc, "field", ""))


async def _scenario(client: Any) -> list[Any]:
    out = [await _outcome(client.create_job('name = "p"\n[algorithm]\nnum_steps = 0\n')),
           await _outcome(client.create_job("name = [unclosed")),
           await _outcome(client.get_job("job-missing"))]
    job = await client.create_job(SPEC, "")
    out.append(job.state)
    for record in ({"policy_version": 1}, {"step": "3"}, {"step": 1, "note": "text"},
                   {"step": 1, "policy_version": 1, "loss": 0.25}):
        out.append(await _outcome(client.report_step(job.job_id, record, "k")))
    out.append(await _outcome(client.report_step(job.job_id, {"step": 1}, "k")))  # repeat
    out.append(await _outcome(client.acquire_lease("w1", t.WorkerRole.HYBRID_ROLLOUT, "",
                                                   "h:1", ttl_ms=1)))
    lease = await client.acquire_lease("w1", t.WorkerRole.HYBRID_ROLLOUT, "", "h:1", 60_000)
    out += [await _outcome(client.renew_lease("w1", lease.epoch + 1)),
            await _outcome(client.change_worker_role("w1", lease.epoch,
                                                     t.WorkerRole.CORE_ROLLOUT)),
            await _outcome(client.change_worker_role("w1", lease.epoch,
                                                     t.WorkerRole.HYBRID_TRAINING))]
    await client.cancel_job(job.job_id)
    out.append(await _outcome(client.report_step(job.job_id, {"step": 2})))
    got, steps, _ = await client.get_job(job.job_id)
    out.append((got.state, got.step, got.policy_version, got.message, steps))
    return out


async def test_the_in_process_client_answers_as_the_grpc_client(
        grpc_client: GrpcCoordinatorClient, tmp_path: Path) -> None:
    over_grpc = await _scenario(grpc_client)
    in_process = await _scenario(InProcessCoordinatorClient(_core(tmp_path / "local")))
    assert in_process == over_grpc
    assert over_grpc[0] == ("error", "InvalidArgument", "algorithm.num_steps")
    assert over_grpc[4] == ("error", "InvalidArgument", "step_json.step")
    assert over_grpc[-1][1:4] == (1, 1, "cancelled by user")
