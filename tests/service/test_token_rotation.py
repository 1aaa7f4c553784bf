"""Rotating tokens without a restart: several valid tokens per kind, files re-read.

Real: a ``libra.grpcx.Server`` with the coordinator servicer and core over
``RedisCoordinatorStore`` on the session's redis-server, the typed gRPC client over a
loopback socket, token files on disk rewritten as an operator would; the REST app with a
``TokenStore`` through httpx's ASGI transport. Fakes: ``FakeRunner`` for the trainer and
scheduler clients. ``TOKEN_CHECK_INTERVAL_S`` is 0 here, so each call looks at the files
(the production 1 s is a cost bound, not a behaviour).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from libra import access
from libra import types as t
from libra.access import TokenStore
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import PermissionDenied, Unauthenticated
from libra.grpc_auth import ClientAuth
from libra.grpcx import Registration, Server
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.service_config import AuthConfig, ServerConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner


@pytest.fixture(autouse=True)
def check_files_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "TOKEN_CHECK_INTERVAL_S", 0.0)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    api, service = tmp_path / "api_token", tmp_path / "service_token"
    api.write_text("api-old\n")
    service.write_text("svc-old\n")
    return {"api": api, "service": service}


@pytest.fixture
def auth(files: dict[str, Path]) -> AuthConfig:
    return AuthConfig(api_token_file=str(files["api"]),
                      service_token_file=str(files["service"]))


@pytest.fixture
async def core(redis: Any, tmp_path: Path) -> AsyncIterator[CoordinatorCore]:
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    yield core
    await core.settle()


@pytest.fixture
async def address(core: CoordinatorCore, auth: AuthConfig) -> AsyncIterator[str]:
    name = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
    server = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=1.0),
                    [Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                                  CoordinatorServicer(core), name)], auth)
    await server.start()
    yield f"127.0.0.1:{server.port}"
    await server.stop()


async def list_jobs_with(address: str, auth: ClientAuth) -> str:
    """"ok", or the refusal's class name."""
    client = GrpcCoordinatorClient(address, timeout_s=30.0, auth=auth)
    try:
        await client.list_jobs()
        return "ok"
    except (Unauthenticated, PermissionDenied) as exc:
        return type(exc).__name__
    finally:
        await client.close()


async def lease_with(address: str, auth: ClientAuth) -> str:
    """An internal call (AcquireLease): "ok" or the refusal's class name."""
    client = GrpcCoordinatorClient(address, timeout_s=30.0, auth=auth)
    try:
        await client.acquire_lease("rollout-9", t.WorkerRole.CORE_ROLLOUT, "short",
                                   "127.0.0.1:1", 3000)
        return "ok"
    except (Unauthenticated, PermissionDenied) as exc:
        return type(exc).__name__
    finally:
        await client.close()


async def who_may_list(address: str, *tokens: str) -> dict[str, str]:
    return {tok: await list_jobs_with(address, ClientAuth(token=tok)) for tok in tokens}


async def test_api_token_rotates_old_and_new_then_new_only(
        address: str, files: dict[str, Path]) -> None:
    assert await who_may_list(address, "api-old", "api-new") == {
        "api-old": "ok", "api-new": "Unauthenticated"}
    files["api"].write_text("api-new\n# the old one, until every client has the new one\n"
                            "api-old\n")
    assert await who_may_list(address, "api-old", "api-new") == {
        "api-old": "ok", "api-new": "ok"}
    files["api"].write_text("api-new\n")
    assert await who_may_list(address, "api-old", "api-new") == {
        "api-old": "Unauthenticated", "api-new": "ok"}
    # A rotated api token is still an api token: internal methods stay closed to it.
    assert await lease_with(address, ClientAuth(token="api-new")) == "PermissionDenied"


async def test_a_broken_token_file_keeps_the_previous_tokens(
        address: str, files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    files["api"].write_text("api-new\n")
    assert await who_may_list(address, "api-new") == {"api-new": "ok"}
    with caplog.at_level(logging.WARNING, logger="libra.access"):
        files["api"].write_text("\n")  # emptied mid-rotation
        assert await who_may_list(address, "api-new", "") == {
            "api-new": "ok", "": "Unauthenticated"}
        files["api"].unlink()
        assert await who_may_list(address, "api-new", "") == {
            "api-new": "ok", "": "Unauthenticated"}
    assert "keeping the previous tokens" in caplog.text


async def test_services_send_the_new_service_token_without_a_restart(
        address: str, auth: AuthConfig, files: dict[str, Path]) -> None:
    # As in a stack: the calling service reads the same service token file.
    service = ClientAuth.for_service(auth)
    assert await lease_with(address, service) == "ok"
    files["service"].write_text("svc-new\nsvc-old\n")
    assert await lease_with(address, service) == "ok"  # sends svc-new, both accepted
    assert await lease_with(address, ClientAuth(token="svc-old")) == "ok"
    files["service"].write_text("svc-new\n")
    assert await lease_with(address, service) == "ok"
    assert await lease_with(address, ClientAuth(token="svc-old")) == "Unauthenticated"


async def test_rest_follows_the_api_token_file(core: CoordinatorCore, auth: AuthConfig,
                                               files: dict[str, Path]) -> None:
    app = build_app(core, TokenStore(auth))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rest") as http:

        async def status_with(token: str) -> int:
            resp = await http.get("/v1/jobs", headers={"authorization": f"Bearer {token}"})
            return resp.status_code

        assert (await status_with("api-old"), await status_with("api-new")) == (200, 401)
        files["api"].write_text("api-new\n")
        assert (await status_with("api-old"), await status_with("api-new")) == (401, 200)
        assert await status_with("svc-old") == 200  # the service token is accepted too
