"""The coordinator refuses unbounded or malformed input before writing anything.

Real: the coordinator servicer and core over real gRPC (``libra.grpcx.Server`` on port 0)
and ``RedisCoordinatorStore`` on the session's redis-server; raw stubs where the typed
client would not send the bad value. Fakes: ``FakeRunner`` for the trainer and scheduler.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import FailedPrecondition, InvalidArgument
from libra.grpcx import Registration, Server, insecure_channel
from libra.limits import MAX_NUM_STEPS, MAX_STEP_JSON_BYTES
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra.service_config import ServerConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
VALID_SPEC = 'name = "bounds"\n[algorithm]\nnum_steps = 3\n'


@pytest.fixture
async def address(redis: Any, tmp_path: Path) -> AsyncIterator[str]:
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=2.0),
                 [Registration(pb_grpc.add_CoordinatorServiceServicer_to_server,
                               CoordinatorServicer(core), SERVICE_NAME)])
    await srv.start()
    yield f"127.0.0.1:{srv.port}"
    await srv.stop()


@pytest.fixture
async def client(address: str) -> AsyncIterator[GrpcCoordinatorClient]:
    c = GrpcCoordinatorClient(address, timeout_s=10.0)
    yield c
    await c.close()


async def _raw(address: str, method: str, request: Any) -> grpc.aio.AioRpcError:
    async with insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(stub, method)(request, timeout=10)
    return info.value


@pytest.mark.parametrize("step_json", [
    "not json", "[1, 2]", '{"policy_version": 1}', '{"step": "3"}', '{"step": true}',
    json.dumps({"step": MAX_NUM_STEPS + 1}), json.dumps({"step": -1}),
    json.dumps({"step": 1, "policy_version": "x"}),
    json.dumps({"step": 1, "pad": "x" * MAX_STEP_JSON_BYTES}), '{"step": 1, "x": "\\ud800"}',
])
async def test_an_invalid_step_report_is_refused_and_stores_nothing(
        address: str, client: GrpcCoordinatorClient, step_json: str) -> None:
    job = await client.create_job(VALID_SPEC)
    err = await _raw(address, "ReportStep", pb.ReportStepRequest(job_id=job.job_id,
                                                                 step_json=step_json))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert re.match(r"step_json(\.\w+)?: ", err.details())  # the field, or the key in it
    got, steps, _ = await client.get_job(job.job_id)  # readable: nothing bad was stored
    assert (steps, got.step, got.policy_version) == ([], 0, job.policy_version)


@pytest.mark.parametrize("end", ["cancel", "done"])
async def test_a_terminal_job_takes_no_step_report(client: GrpcCoordinatorClient,
                                                   end: str) -> None:
    job = await client.create_job(VALID_SPEC)
    await client.report_step(job.job_id, {"step": 1, "policy_version": 1})
    if end == "cancel":
        await client.cancel_job(job.job_id)
    else:
        await client.report_job_done(job.job_id, t.JobState.SUCCEEDED, "")
    with pytest.raises(FailedPrecondition, match="its steps are final"):
        await client.report_step(job.job_id, {"step": 9, "policy_version": 9})
    got, steps, _ = await client.get_job(job.job_id)
    assert got.state.is_terminal and (got.step, got.policy_version) == (1, 1)
    assert [s["step"] for s in steps] == [1]


@pytest.mark.parametrize("worker_id, why", [
    ("", "must not be empty"), ("w\nforged", "printable"), ("x" * 3_000_000, "at most 256")])
async def test_bad_worker_ids_are_invalid_argument_on_every_lease_call(
        address: str, worker_id: str, why: str) -> None:
    calls = [("AcquireLease", pb.AcquireLeaseRequest(worker_id=worker_id, role=1,
                                                      ttl_ms=3000)),
             ("RenewLease", pb.RenewLeaseRequest(worker_id=worker_id, epoch=1)),
             ("ReleaseLease", pb.ReleaseLeaseRequest(worker_id=worker_id, epoch=1)),
             ("ChangeWorkerRole", pb.ChangeWorkerRoleRequest(worker_id=worker_id, role=3))]
    for method, request in calls:
        err = await _raw(address, method, request)
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, method
        assert err.details().startswith("worker_id: ") and why in err.details(), method


async def test_a_huge_job_name_is_refused_and_list_jobs_stays_small(
        address: str, client: GrpcCoordinatorClient) -> None:
    spec = 'name = "' + "n" * (50 << 20) + '"\n'  # the probe's 50 MB name
    err = await _raw(address, "CreateJob", pb.CreateJobRequest(spec=spec))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("spec: ") and "at most 1048576" in err.details()
    with pytest.raises(InvalidArgument) as info:
        await client.create_job('name = "' + "n" * 129 + '"\n')
    assert info.value.field == "name"
    assert await client.list_jobs() == []


async def test_a_lone_surrogate_in_a_json_spec_names_spec(client: GrpcCoordinatorClient) -> None:
    with pytest.raises(InvalidArgument) as info:
        await client.create_job('{"name": "\\ud800"}', "json")
    assert info.value.field == "spec"


async def test_status_details_echoing_a_huge_value_are_cut_not_lost(address: str) -> None:
    # Uncut, the 1 MB echo overflowed the metadata limit: RESOURCE_EXHAUSTED, no field.
    err = await _raw(address, "CreateJob", pb.CreateJobRequest(spec="a = 1",
                                                               spec_format="x" * 1_000_000))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("spec_format: unknown format 'xxx")
    assert len(err.details()) < 2100 and err.details().endswith("characters in all)")


class HeldAppendStore(RedisCoordinatorStore):
    """Holds the first step append until released, as a slow network would."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def append_step(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return await super().append_step(*args, **kwargs)


async def test_a_cancel_during_a_step_report_is_not_overwritten(redis: Any,
                                                                tmp_path: Path) -> None:
    store = HeldAppendStore(redis, SystemClock())
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), SystemClock(), tmp_path)
    job = await core.create_job(VALID_SPEC, "toml")
    report = asyncio.create_task(core.report_step(job.job_id, t.StepRecord(
        step=1, policy_version=1)))
    await store.entered.wait()  # the report has read the job (RUNNING)
    cancel = asyncio.create_task(core.cancel_job(job.job_id))
    # Without serialisation the cancel completes here and the report then writes the
    # job back RUNNING; with it the cancel waits (the wait ends either way).
    await asyncio.wait({cancel}, timeout=1.0)
    store.release.set()
    await asyncio.gather(report, cancel)
    assert (await store.get_job(job.job_id)).state is t.JobState.CANCELLED
