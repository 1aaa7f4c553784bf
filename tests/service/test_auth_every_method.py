"""Every gRPC method and every REST route refuses callers without the right token.

Real: one ``libra.grpcx.Server`` per Libra service (the services each process serves, on a
loopback socket, with the auth interceptor), server reflection as the list of methods, raw
calls over a ``grpc.aio`` channel; the coordinator's FastAPI app served by uvicorn on a
socket with the real core on the session's redis-server.
Not real: behind the auth check the gRPC servers run the generated base servicers (they
answer UNIMPLEMENTED), since only whether a call gets past the check is under test here.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import uvicorn
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from libra.access import Access, libra_methods
from libra.clock import SystemClock
from libra.grpc_auth import ClientAuth
from libra.grpcx import Registration, Server, client_channel
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.proto.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from libra.service_config import AuthConfig, ServerConfig
from libra_cli.redis_server import free_port
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner

API_TOKEN = "api-token-for-tests"
SERVICE_TOKEN = "service-token-for-tests"
AUTH = AuthConfig(api_token=API_TOKEN, service_token=SERVICE_TOKEN)
CALL_DEADLINE_S = 30.0  # generous: a loaded 2-core machine must not turn a code into a timeout

# What each process serves (as in services/*/__main__.py).
PROCESSES: dict[str, list[tuple[Any, Any, Any, str]]] = {
    "coordinator": [(coordinator_pb2, coordinator_pb2_grpc, "CoordinatorService", "")],
    "scheduler": [(scheduler_pb2, scheduler_pb2_grpc, "SchedulerService", "")],
    "trainer": [(trainer_pb2, trainer_pb2_grpc, "TrainerService", ""),
                (trainer_pb2, trainer_pb2_grpc, "GradientChannel", ""),
                (trainer_pb2, trainer_pb2_grpc, "WeightService", "")],
    "toolgateway": [(toolgateway_pb2, toolgateway_pb2_grpc, "ToolGatewayService", "")],
    "rollout": [(rollout_pb2, rollout_pb2_grpc, "RolloutService", "")],
}


def _registration(pb2: Any, pb2_grpc: Any, name: str) -> Registration:
    servicer = getattr(pb2_grpc, f"{name}Servicer")()
    add = getattr(pb2_grpc, f"add_{name}Servicer_to_server")
    return Registration(add, servicer, pb2.DESCRIPTOR.services_by_name[name].full_name)


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    try:
        for process, services in PROCESSES.items():
            srv = Server(process, ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=1.0),
                         [_registration(pb2, g, n) for pb2, g, n, _ in services], AUTH)
            await srv.start()
            started[process] = srv
        yield started
    finally:
        for srv in started.values():
            await srv.stop()


def _reflected_methods(address: str) -> dict[str, bool]:
    """``/Service/Method`` -> is streaming, for every service the server reflects
    (sync reflection client: run it in a thread while the aio server serves)."""
    with grpc.insecure_channel(address) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(db)
        out: dict[str, bool] = {}
        for name in db.get_services():
            service = pool.FindServiceByName(name)
            for method in service.methods:
                out[f"/{name}/{method.name}"] = method.client_streaming
        return out


async def _call(channel: grpc.aio.Channel, path: str, streaming: bool,
                token: str | None) -> grpc.StatusCode:
    """Send an empty request (any message parses from no bytes) and return the code.

    A stream sends no message at all: the token is checked on the call's metadata, and a
    message sent while the server is already refusing the call can fail on the client
    as INTERNAL ("Internal error from Core", a send racing the server's close)."""
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    ident = lambda b: b  # noqa: E731 - raw bytes both ways
    try:
        if streaming:
            call = channel.stream_stream(path, request_serializer=ident,
                                         response_deserializer=ident)(
                iter([]), metadata=metadata, timeout=CALL_DEADLINE_S)
            async for _ in call:
                pass
        else:
            await channel.unary_unary(path, request_serializer=ident,
                                      response_deserializer=ident)(
                b"", metadata=metadata, timeout=CALL_DEADLINE_S)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def _all_methods(servers: dict[str, Server]) -> list[tuple[str, str, bool]]:
    rows = []
    for srv in servers.values():
        address = f"127.0.0.1:{srv.port}"
        for path, streaming in (await asyncio.to_thread(_reflected_methods, address)).items():
            rows.append((address, path, streaming))
    return rows


async def test_reflection_lists_every_proto_method_and_the_open_services(
        servers: dict[str, Server]) -> None:
    rows = await _all_methods(servers)
    libra = {path for _, path, _ in rows if path.startswith("/libra.")}
    assert libra == set(libra_methods())  # each method served exactly where expected
    assert any(path.startswith("/grpc.health.v1.Health/") for _, path, _ in rows)


@pytest.mark.parametrize("token", [None, "", "not-a-token", API_TOKEN[:-1]],
                         ids=["no-header", "empty", "wrong", "prefix-of-api-token"])
async def test_every_libra_method_refuses_a_call_without_a_valid_token(
        servers: dict[str, Server], token: str | None) -> None:
    rows = await _all_methods(servers)
    codes = {}
    for address, path, streaming in rows:
        if path.startswith("/libra."):
            async with grpc.aio.insecure_channel(address) as channel:
                codes[path] = await _call(channel, path, streaming, token)
    assert len(codes) == len(libra_methods())
    assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}, codes


async def test_the_api_token_calls_public_methods_only(servers: dict[str, Server]) -> None:
    rows = await _all_methods(servers)
    expected = libra_methods()
    assert {a for a in expected.values()} == {Access.PUBLIC, Access.INTERNAL}
    for address, path, streaming in rows:
        if not path.startswith("/libra."):
            continue
        async with grpc.aio.insecure_channel(address) as channel:
            code = await _call(channel, path, streaming, API_TOKEN)
        if expected[path] is Access.INTERNAL:
            assert code == grpc.StatusCode.PERMISSION_DENIED, path
        else:  # past the check: the base servicer answers
            assert code == grpc.StatusCode.UNIMPLEMENTED, path


async def test_the_service_token_calls_every_method(servers: dict[str, Server]) -> None:
    codes = {}
    for address, path, streaming in await _all_methods(servers):
        if path.startswith("/libra."):
            async with grpc.aio.insecure_channel(address) as channel:
                codes[path] = await _call(channel, path, streaming, SERVICE_TOKEN)
    assert codes == dict.fromkeys(libra_methods(), grpc.StatusCode.UNIMPLEMENTED)


async def test_the_client_channel_sends_the_token_on_every_call_shape(
        servers: dict[str, Server]) -> None:
    """``libra.grpcx.client_channel`` (what every typed client uses) attaches the token to
    unary and streaming calls alike (the gradient and tool-return streams)."""
    rows = [r for r in await _all_methods(servers) if r[1].startswith("/libra.")]
    assert any(streaming for _, _, streaming in rows)
    codes = {}
    for address, path, streaming in rows:
        async with client_channel(address, ClientAuth(SERVICE_TOKEN)) as channel:
            codes[path] = await _call(channel, path, streaming, token=None)
    assert codes == dict.fromkeys(libra_methods(), grpc.StatusCode.UNIMPLEMENTED)


async def test_refusals_are_counted_per_method_and_code(servers: dict[str, Server]) -> None:
    from prometheus_client import REGISTRY

    def refused(method: str, code: str) -> float:
        return REGISTRY.get_sample_value("libra_rpc_auth_refused_total",
                                         {"method": method, "code": code}) or 0.0

    address = f"127.0.0.1:{servers['trainer'].port}"
    path = "/libra.proto.trainer.v1.TrainerService/StopJob"
    before = (refused("StopJob", "UNAUTHENTICATED"), refused("StopJob", "PERMISSION_DENIED"))
    async with grpc.aio.insecure_channel(address) as channel:
        for _ in range(3):
            await _call(channel, path, False, None)
        await _call(channel, path, False, API_TOKEN)
    after = (refused("StopJob", "UNAUTHENTICATED"), refused("StopJob", "PERMISSION_DENIED"))
    assert (after[0] - before[0], after[1] - before[1]) == (3.0, 1.0)


async def test_health_and_reflection_need_no_token(servers: dict[str, Server]) -> None:
    for srv in servers.values():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            resp = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5.0)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    # Reflection answered above without a token, or _all_methods would have failed.
    assert await _all_methods(servers)


# -- REST -------------------------------------------------------------------------------


@pytest.fixture
async def rest(redis: Any, tmp_path: Path) -> AsyncIterator[str]:
    """The coordinator's REST app with both tokens, served by uvicorn on a socket."""
    from libra.access import load_tokens

    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(core, load_tokens(AUTH)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "uvicorn exited at start-up"
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


def _routes(openapi: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, path with placeholders filled) of every documented operation."""
    return [(method.upper(), re.sub(r"\{[^}]+\}", "job-x", path))
            for path, ops in openapi["paths"].items() for method in ops]


async def test_every_rest_route_refuses_a_call_without_a_valid_token(rest: str) -> None:
    async with httpx.AsyncClient(base_url=rest, timeout=10.0) as http:
        openapi = (await http.get("/openapi.json")).json()  # open, like /docs
        routes = _routes(openapi)
        assert len(routes) >= 6
        for method, path in routes:
            for headers in ({}, {"Authorization": "Bearer wrong"},
                            {"Authorization": f"Basic {API_TOKEN}"}):
                resp = await http.request(method, path, headers=headers, json={"spec": ""})
                assert resp.status_code == 401, (method, path, headers)
                assert resp.headers["www-authenticate"] == "Bearer"
        for path, ops in openapi["paths"].items():  # the 401 is documented
            assert all("401" in op["responses"] for op in ops.values()), path
        assert (await http.get("/docs")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200


async def test_rest_routes_take_the_api_and_the_service_token(rest: str) -> None:
    async with httpx.AsyncClient(base_url=rest, timeout=10.0) as http:
        for token in (API_TOKEN, SERVICE_TOKEN):
            headers = {"Authorization": f"Bearer {token}"}
            assert (await http.get("/v1/jobs", headers=headers)).status_code == 200
            assert (await http.get("/v1/jobs/nope", headers=headers)).status_code == 404
