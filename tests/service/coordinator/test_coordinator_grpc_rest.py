"""The coordinator's gRPC and REST shells over one core.

Real: an in-process ``grpc.aio`` server on port 0 built by ``libra.grpcx.Server`` (error
interceptor, health, reflection), the typed ``GrpcCoordinatorClient``, the FastAPI app,
the core and ``RedisCoordinatorStore`` on the session's redis-server.
Fakes: ``FakeRunner`` replaces the trainer and scheduler clients.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import FailedPrecondition, InvalidArgument, LeaseLost, NotFound
from libra.grpcx import Registration, Server
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.service_config import ServerConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
VALID_SPEC = 'name = "svc"\n[algorithm]\nnum_steps = 2\n'




@pytest.fixture
def core(redis: Any, tmp_path: Path) -> CoordinatorCore:
    return CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")


@pytest.fixture
async def server(core: CoordinatorCore) -> AsyncIterator[Server]:
    registration = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                                CoordinatorServicer(core), SERVICE_NAME)
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=2.0),
                 [registration])
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client(server: Server) -> AsyncIterator[GrpcCoordinatorClient]:
    c = GrpcCoordinatorClient(f"127.0.0.1:{server.port}", timeout_s=30.0)  # a hang guard
    yield c
    await c.close()


# -- gRPC -----------------------------------------------------------------------------


async def test_grpc_create_job_returns_running_job(client: GrpcCoordinatorClient) -> None:
    job = await client.create_job(VALID_SPEC)
    assert job.state is t.JobState.RUNNING
    assert json.loads(job.spec_json)["algorithm"]["num_steps"] == 2


async def test_grpc_get_job_returns_steps_and_counters(client: GrpcCoordinatorClient) -> None:
    job = await client.create_job(VALID_SPEC)
    await client.report_step(job.job_id, {"step": 1, "policy_version": 1, "reward_mean": 0.25})
    got, steps, counters = await client.get_job(job.job_id)
    assert (got.job_id, got.step, got.policy_version) == (job.job_id, 1, 1)
    assert steps == [{"step": 1, "policy_version": 1, "reward_mean": 0.25}]
    # Nothing counted yet; the backlog is measured from the (empty) queues.
    assert counters == {"in_flight_unconsumed": 0, "in_flight_running": 0,
                        "in_flight_pending_admission": 0}


async def test_grpc_a_step_report_retried_with_its_key_is_stored_once(
        client: GrpcCoordinatorClient) -> None:
    job = await client.create_job(VALID_SPEC)
    for _ in range(2):  # the trainer's retry after a lost reply: same key
        await client.report_step(job.job_id, {"step": 1, "reward_mean": 0.25}, "k:1:a")
    await client.report_step(job.job_id, {"step": 1, "reward_mean": 0.75}, "k:1:b")
    _, steps, _ = await client.get_job(job.job_id)
    assert steps == [{"step": 1, "reward_mean": 0.75}]  # a redone step replaced it
    assert [e["kind"] for e in await client.get_job_events(job.job_id)] == ["step_redone"]


async def test_grpc_list_jobs_lists_created_job(client: GrpcCoordinatorClient) -> None:
    job = await client.create_job(VALID_SPEC)
    assert [j.job_id for j in await client.list_jobs()] == [job.job_id]


async def test_grpc_cancel_job_returns_cancelled_job(client: GrpcCoordinatorClient) -> None:
    job = await client.create_job(VALID_SPEC)
    cancelled = await client.cancel_job(job.job_id)
    assert (cancelled.state, cancelled.message) == (t.JobState.CANCELLED, "cancelled by user")


async def test_grpc_cancel_job_with_a_reason_keeps_it_as_the_message(
        client: GrpcCoordinatorClient) -> None:
    job = await client.create_job(VALID_SPEC)
    cancelled = await client.cancel_job(job.job_id, "libra run interrupted (SIGTERM)")
    assert cancelled.message == "libra run interrupted (SIGTERM)"


async def test_grpc_invalid_spec_raises_invalid_argument_with_field(
        client: GrpcCoordinatorClient) -> None:
    with pytest.raises(InvalidArgument) as info:
        await client.create_job("[algorithm]\nclip_eps = 2.0\n")
    assert info.value.field == "algorithm.clip_eps"
    assert await client.list_jobs() == []


async def test_grpc_unknown_job_raises_not_found(client: GrpcCoordinatorClient) -> None:
    with pytest.raises(NotFound):
        await client.get_job("missing")


async def test_grpc_second_job_is_queued_pending(client: GrpcCoordinatorClient) -> None:
    await client.create_job(VALID_SPEC)
    second = await client.create_job(VALID_SPEC)
    assert (second.state, second.queue_position) == (t.JobState.PENDING, 1)


async def test_concurrent_creates_start_exactly_one_job(client: GrpcCoordinatorClient) -> None:
    results = await asyncio.gather(*(client.create_job(VALID_SPEC) for _ in range(4)))
    assert sorted(r.state.value for r in results) == ["pending"] * 3 + ["running"]
    assert sorted(j.queue_position for j in await client.list_jobs()) == [0, 1, 2, 3]


async def test_grpc_lease_round_trip_and_fencing(client: GrpcCoordinatorClient) -> None:
    lease = await client.acquire_lease("r0", t.WorkerRole.CORE_ROLLOUT, "short", "h:1", 2_000)
    renewed = await client.renew_lease("r0", lease.epoch)
    assert (renewed.epoch, renewed.role) == (lease.epoch, t.WorkerRole.CORE_ROLLOUT)
    assert [w.worker_id for w in await client.list_workers()] == ["r0"]
    await client.release_lease("r0", lease.epoch)
    with pytest.raises(LeaseLost):
        await client.renew_lease("r0", lease.epoch)


async def test_grpc_change_worker_role_takes_a_fresh_epoch(
        client: GrpcCoordinatorClient) -> None:
    lease = await client.acquire_lease("h1", t.WorkerRole.HYBRID_ROLLOUT, "short", "h:1",
                                       5_000)
    joining = await client.change_worker_role("h1", lease.epoch, t.WorkerRole.HYBRID_JOINING)
    assert joining.role is t.WorkerRole.HYBRID_JOINING and joining.epoch > lease.epoch
    assert [(w.role, w.epoch) for w in await client.list_workers()] == [
        (t.WorkerRole.HYBRID_JOINING, joining.epoch)]


async def test_grpc_change_worker_role_on_stale_epoch_raises_lease_lost(
        client: GrpcCoordinatorClient) -> None:
    lease = await client.acquire_lease("h1", t.WorkerRole.HYBRID_ROLLOUT, "short", "h:1",
                                       5_000)
    await client.change_worker_role("h1", lease.epoch, t.WorkerRole.HYBRID_JOINING)
    with pytest.raises(LeaseLost) as err:
        await client.change_worker_role("h1", lease.epoch, t.WorkerRole.HYBRID_ROLLOUT)
    assert f"expected epoch {lease.epoch}" in str(err.value)


async def test_grpc_change_worker_role_refuses_a_disallowed_move(
        client: GrpcCoordinatorClient) -> None:
    lease = await client.acquire_lease("r0", t.WorkerRole.CORE_ROLLOUT, "short", "h:1", 5_000)
    with pytest.raises(FailedPrecondition):
        await client.change_worker_role("r0", lease.epoch, t.WorkerRole.HYBRID_JOINING)
    with pytest.raises(InvalidArgument) as err:
        await client.change_worker_role("r0", lease.epoch, t.WorkerRole.CORE_TRAINING)
    assert err.value.field == "role"


async def test_grpc_bad_ttl_raises_invalid_argument_naming_ttl_ms(
        client: GrpcCoordinatorClient) -> None:
    with pytest.raises(InvalidArgument) as info:
        await client.acquire_lease("r0", t.WorkerRole.CORE_ROLLOUT, "short", "h:1", 1)
    assert info.value.field == "ttl_ms"


async def test_health_reports_serving(server: Server) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=30)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_coordinator_service(server: Server) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(timeout=30)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        resp = await call.read()
        await call.done_writing()
    names = {s.name for s in resp.list_services_response.service}
    assert SERVICE_NAME in names
    assert "grpc.health.v1.Health" in names


async def test_stop_flips_health_to_not_serving_before_the_server_stops(
        core: CoordinatorCore) -> None:
    registration = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                                CoordinatorServicer(core), SERVICE_NAME)
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=2.0),
                 [registration])
    await srv.start()
    seen: list[int] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def drain(_grace_s: float) -> None:
            # Runs inside stop(), while the server still answers RPCs.
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
            seen.append(resp.status)

        await srv.stop(drain)
    assert seen == [health_pb2.HealthCheckResponse.NOT_SERVING]


# -- REST -----------------------------------------------------------------------------
# httpx.AsyncClient over ASGITransport is what TestClient wraps; it runs the app on the
# test's own event loop, which the Redis client is bound to.


@pytest.fixture
async def http(core: CoordinatorCore) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=build_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as c:
        yield c


async def test_rest_post_valid_job_returns_201(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/jobs", json={"spec": VALID_SPEC})
    assert resp.status_code == 201
    body = resp.json()
    assert body["state"] == "running"
    assert body["spec"]["algorithm"]["num_steps"] == 2


async def test_rest_post_json_spec_is_accepted(http: httpx.AsyncClient) -> None:
    spec = json.dumps({"name": "js", "algorithm": {"num_steps": 4}})
    resp = await http.post("/v1/jobs", json={"spec": spec, "format": "json"})
    assert resp.status_code == 201
    assert resp.json()["name"] == "js"


async def test_rest_post_invalid_job_returns_400_with_field(http: httpx.AsyncClient) -> None:
    resp = await http.post("/v1/jobs", json={"spec": "[tools]\nenabled = [\"nuke\"]\n"})
    assert resp.status_code == 400
    assert resp.json()["field"] == "tools.enabled"
    assert (await http.get("/v1/jobs")).json() == []


async def test_rest_second_job_is_queued(http: httpx.AsyncClient) -> None:
    await http.post("/v1/jobs", json={"spec": VALID_SPEC})
    resp = await http.post("/v1/jobs", json={"spec": VALID_SPEC})
    assert resp.status_code == 201
    assert (resp.json()["state"], resp.json()["queue_position"]) == ("pending", 1)


async def test_rest_get_job_returns_job_with_steps(http: httpx.AsyncClient,
                                                   core: CoordinatorCore) -> None:
    job_id = (await http.post("/v1/jobs", json={"spec": VALID_SPEC})).json()["job_id"]
    await core.report_step(job_id, t.StepRecord(step=1, reward_mean=0.5))
    resp = await http.get(f"/v1/jobs/{job_id}")
    assert resp.status_code == 200
    assert resp.json()["steps"] == [{"step": 1, "reward_mean": 0.5}]
    assert resp.json()["step"] == 1


async def test_rest_job_events_are_listed_in_order(http: httpx.AsyncClient,
                                                  core: CoordinatorCore, redis: Any) -> None:
    job_id = (await http.post("/v1/jobs", json={"spec": VALID_SPEC})).json()["job_id"]
    store = RedisCoordinatorStore(redis, SystemClock())
    await store.record_event(job_id, {"ts_ms": 1, "kind": "plan", "desired": 1})
    await store.record_event(job_id, {"ts_ms": 2, "kind": "join_requested", "epoch": 4})
    resp = await http.get(f"/v1/jobs/{job_id}/events")
    assert [e["kind"] for e in resp.json()] == ["plan", "join_requested"]
    assert [e["kind"] for e in (await http.get(f"/v1/jobs/{job_id}")).json()["events"]] == [
        "plan", "join_requested"]
    assert (await http.get("/v1/jobs/nope/events")).status_code == 404


async def test_rest_get_unknown_job_returns_404(http: httpx.AsyncClient) -> None:
    resp = await http.get("/v1/jobs/nope")
    assert resp.status_code == 404
    assert resp.json()["error"] == "not_found"


async def test_rest_cancel_job_returns_cancelled(http: httpx.AsyncClient) -> None:
    job_id = (await http.post("/v1/jobs", json={"spec": VALID_SPEC})).json()["job_id"]
    resp = await http.post(f"/v1/jobs/{job_id}/cancel")
    assert resp.status_code == 200
    assert resp.json()["state"] == "cancelled"


async def test_rest_workers_lists_live_leases(http: httpx.AsyncClient,
                                             core: CoordinatorCore) -> None:
    await core.acquire_lease("t0", t.WorkerRole.CORE_TRAINING, "", "h:2", 5_000)
    resp = await http.get("/v1/workers")
    assert resp.status_code == 200
    assert [(w["worker_id"], w["role"]) for w in resp.json()] == [("t0", "core-training")]
    assert {"epoch", "bucket", "address"} <= set(resp.json()[0])


async def test_rest_openapi_lists_paths_and_docs_are_served(http: httpx.AsyncClient) -> None:
    paths = set((await http.get("/openapi.json")).json()["paths"])
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
            "/v1/workers"} <= paths
    assert (await http.get("/docs")).status_code == 200
