"""The job queue and resume through the coordinator's gRPC and REST shells.

Real: an in-process ``grpc.aio`` server on port 0 (``libra.grpcx.Server`` with its error
interceptor), the typed ``GrpcCoordinatorClient``, the FastAPI app, the core, and
``RedisCoordinatorStore`` on the session's redis-server; checkpoints are real folders.
Fakes: ``FakeRunner`` replaces the trainer and scheduler clients.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from libra.grpcx import Registration, Server
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.service_config import ServerConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
SPEC = 'name = "qapi"\n[algorithm]\nnum_steps = 2\n'


@pytest.fixture
async def core(redis: Any, tmp_path: Path) -> AsyncIterator[CoordinatorCore]:
    built = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                            FakeRunner(), SystemClock(), tmp_path / "runs", max_queued_jobs=2)
    yield built
    await built.settle()


@pytest.fixture
async def client(core: CoordinatorCore) -> AsyncIterator[GrpcCoordinatorClient]:
    registration = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                                CoordinatorServicer(core), SERVICE_NAME)
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=2.0),
                 [registration])
    await srv.start()
    c = GrpcCoordinatorClient(f"127.0.0.1:{srv.port}", timeout_s=30.0)  # a hang guard
    yield c
    await c.close()
    await srv.stop()


@pytest.fixture
async def http(core: CoordinatorCore) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as c:
        yield c


def _checkpoint(job: t.Job | dict[str, Any], step: int = 1) -> None:
    run_dir = job.run_dir if isinstance(job, t.Job) else job["run_dir"]
    folder = Path(run_dir) / "checkpoints" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": step, "policy_version": 0,
                                                  "files": {}}))


# -- gRPC -----------------------------------------------------------------------------


async def test_grpc_queue_orders_by_priority_and_a_full_queue_is_resource_exhausted(
        client: GrpcCoordinatorClient, core: CoordinatorCore) -> None:
    running = await client.create_job(SPEC)
    low = await client.create_job(SPEC, priority=-1)
    high = await client.create_job(SPEC, priority=9)
    assert (low.queue_position, high.queue_position) == (1, 1)  # each as of its submit
    positions = {j.job_id: j.queue_position for j in await client.list_jobs()}
    assert (positions[low.job_id], positions[high.job_id]) == (2, 1)
    assert (high.priority, high.state) == (9, t.JobState.PENDING)
    with pytest.raises(ResourceExhausted, match="max_queued_jobs = 2") as err:
        await client.create_job(SPEC)
    assert err.value.grpc_status_name == grpc.StatusCode.RESOURCE_EXHAUSTED.name
    await client.report_job_done(running.job_id, t.JobState.SUCCEEDED, "done")
    await core.settle()  # the next job starts after the report's reply
    jobs = {j.job_id: j for j in await client.list_jobs()}
    assert (jobs[high.job_id].state, jobs[high.job_id].queue_position) == (
        t.JobState.RUNNING, 0)
    assert jobs[low.job_id].queue_position == 1


async def test_grpc_out_of_range_priority_is_invalid_argument(
        client: GrpcCoordinatorClient) -> None:
    with pytest.raises(InvalidArgument, match="priority"):
        await client.create_job(SPEC, priority=-1001)


async def test_grpc_resume_errors_and_success(client: GrpcCoordinatorClient) -> None:
    with pytest.raises(NotFound):
        await client.resume_job("no-such-job")
    job = await client.create_job(SPEC)
    with pytest.raises(FailedPrecondition, match="is running"):
        await client.resume_job(job.job_id)
    await client.cancel_job(job.job_id)
    with pytest.raises(FailedPrecondition, match="no checkpoint"):
        await client.resume_job(job.job_id)
    _checkpoint(job, 3)
    resumed = await client.resume_job(job.job_id)
    assert (resumed.job_id, resumed.state, resumed.num_resumes) == (
        job.job_id, t.JobState.RUNNING, 1)
    assert resumed.message == "resumed from the checkpoint of step 3"


# -- REST -----------------------------------------------------------------------------


async def test_rest_priority_from_body_or_query_and_429_when_full(
        http: httpx.AsyncClient) -> None:
    await http.post("/v1/jobs", json={"spec": SPEC})
    body = (await http.post("/v1/jobs", json={"spec": SPEC, "priority": 2})).json()
    query = (await http.post("/v1/jobs?priority=5", json={"spec": SPEC})).json()
    assert (body["priority"], body["queue_position"]) == (2, 1)
    assert (query["priority"], query["queue_position"]) == (5, 1)  # ahead of priority 2
    listed = {j["job_id"]: j["queue_position"] for j in (await http.get("/v1/jobs")).json()}
    assert (listed[body["job_id"]], listed[query["job_id"]]) == (2, 1)
    full = await http.post("/v1/jobs", json={"spec": SPEC})
    assert full.status_code == 429
    assert full.json()["error"] == "resource_exhausted"
    assert "max_queued_jobs" in full.json()["message"]


async def test_rest_bad_priority_is_400_naming_the_field(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/jobs", json={"spec": SPEC, "priority": 5000})
    assert (resp.status_code, resp.json()["field"]) == (400, "priority")


async def test_rest_resume_statuses(http: httpx.AsyncClient) -> None:
    assert (await http.post("/v1/jobs/nope/resume")).status_code == 404
    job = (await http.post("/v1/jobs", json={"spec": SPEC})).json()
    running = await http.post(f"/v1/jobs/{job['job_id']}/resume")
    assert running.status_code == 409 and "is running" in running.json()["message"]
    await http.post(f"/v1/jobs/{job['job_id']}/cancel")
    no_ckpt = await http.post(f"/v1/jobs/{job['job_id']}/resume")
    assert no_ckpt.status_code == 409 and "no checkpoint" in no_ckpt.json()["message"]
    _checkpoint(job)
    resumed = await http.post(f"/v1/jobs/{job['job_id']}/resume", json={"priority": 1})
    assert resumed.status_code == 200
    assert (resumed.json()["state"], resumed.json()["num_resumes"]) == ("running", 1)
