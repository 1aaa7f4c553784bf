"""TLS for gRPC and HTTPS for REST, from the files ``libra certs`` writes.

Real: certificates made by ``libra_cli.tls_certs`` (cryptography), the coordinator's servicer and
core on the session's redis-server behind a ``libra.grpcx.Server`` with TLS and tokens,
the typed client, the health probe, and the REST app served by uvicorn over HTTPS.
Fakes: ``FakeRunner`` replaces the trainer and scheduler clients.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from libra import types as t
from libra.access import load_tokens
from libra.clients import base as client_base
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import PermissionDenied, Unauthenticated, Unavailable
from libra.grpc_auth import ClientAuth
from libra.grpcx import Registration, Server
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.service_config import AuthConfig, ServerConfig
from libra_cli.healthcheck import check
from libra_cli.main import main as cli_main
from libra_cli.redis_server import free_port
from libra_cli.tls_certs import CertPaths, make_certs
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner

API, SERVICE = "api-tls-token", "service-tls-token"
SPEC = 'name = "tls"\n[algorithm]\nnum_steps = 2\n'
NAME = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name


@pytest.fixture(autouse=True)
def _short_reconnect_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call refused before it was sent is made once more after waiting for the channel's
    next connection attempt (``RECONNECT_WAIT_S``, 3 s, sized for a restarted peer). Here
    no peer restarts and a refused handshake is refused again however long the wait, so
    the refusal tests get the same Unavailable without waiting 3 s each."""
    monkeypatch.setattr(client_base, "RECONNECT_WAIT_S", 0.3)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertPaths:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def auth(certs: CertPaths) -> AuthConfig:
    return AuthConfig(api_token=API, service_token=SERVICE, tls_cert_file=str(certs.server),
                      tls_key_file=str(certs.server_key), tls_ca_file=str(certs.ca))


@pytest.fixture
def core(redis: Any, tmp_path: Path) -> CoordinatorCore:
    return CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")


@pytest.fixture
async def address(core: CoordinatorCore, auth: AuthConfig) -> AsyncIterator[str]:
    reg = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                       CoordinatorServicer(core), NAME)
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=1.0),
                 [reg], auth)
    await srv.start()
    yield f"127.0.0.1:{srv.port}"
    await srv.stop()


async def _list(address: str, auth: ClientAuth | None) -> list[t.Job]:
    client = GrpcCoordinatorClient(address, timeout_s=5.0, auth=auth)
    try:
        return await client.list_jobs()
    finally:
        await client.close()


async def test_typed_client_over_tls_with_the_api_token(address: str, certs: CertPaths) -> None:
    client = GrpcCoordinatorClient(address, timeout_s=5.0,
                                   auth=ClientAuth(API, str(certs.ca)))
    try:
        job = await client.create_job(SPEC)
        assert [j.job_id for j in await client.list_jobs()] == [job.job_id]
        with pytest.raises(PermissionDenied, match="AcquireLease is internal"):
            await client.acquire_lease("w-1", t.WorkerRole.CORE_ROLLOUT, "short", "x:1", 3000)
    finally:
        await client.close()


async def test_tls_without_a_token_is_unauthenticated(address: str, certs: CertPaths) -> None:
    with pytest.raises(Unauthenticated):
        await _list(address, ClientAuth("", str(certs.ca)))


async def test_plaintext_client_cannot_talk_to_a_tls_server(address: str) -> None:
    with pytest.raises(Unavailable):
        await _list(address, ClientAuth(API))


async def test_a_server_certificate_from_another_ca_is_refused(
        address: str, tmp_path: Path) -> None:
    other = make_certs(tmp_path / "other")
    with pytest.raises(Unavailable):
        await _list(address, ClientAuth(API, str(other.ca)))


async def test_health_probe_over_tls_needs_the_ca_but_no_token(
        address: str, certs: CertPaths) -> None:
    assert await asyncio.to_thread(check, address, "", 5.0, str(certs.ca)) == "SERVING"
    assert await asyncio.to_thread(check, address, "", 2.0) == "UNREACHABLE"


async def test_cli_sends_its_token_file_and_ca(address: str, certs: CertPaths,
                                               tmp_path: Path) -> None:
    token = tmp_path / "api_token"
    token.write_text(API + "\n")
    base = ["--run-root", str(tmp_path), "--coordinator", address,
            "--tls-ca-file", str(certs.ca)]
    assert await asyncio.to_thread(cli_main, [*base, "--token-file", str(token),
                                              "jobs", "--json"]) == 0
    assert await asyncio.to_thread(cli_main, [*base, "jobs"]) == 2  # no token: refused


@pytest.fixture
async def https(core: CoordinatorCore, auth: AuthConfig) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        build_app(core, load_tokens(auth)), host="127.0.0.1", port=port, log_level="warning",
        ssl_certfile=auth.tls_cert_file, ssl_keyfile=auth.tls_key_file))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "uvicorn exited at start-up"
        await asyncio.sleep(0.01)
    yield f"127.0.0.1:{port}"
    server.should_exit = True
    await task


async def test_rest_over_https(https: str, certs: CertPaths) -> None:
    verify = ssl.create_default_context(cafile=str(certs.ca))
    async with httpx.AsyncClient(base_url=f"https://{https}", verify=verify,
                                 timeout=10.0) as http:
        headers = {"Authorization": f"Bearer {API}"}
        created = await http.post("/v1/jobs", json={"spec": SPEC}, headers=headers)
        assert created.status_code == 201, created.text
        assert (await http.get("/v1/jobs")).status_code == 401
    async with httpx.AsyncClient(base_url=f"http://{https}", timeout=10.0) as plain:
        with pytest.raises(httpx.HTTPError):
            await plain.get("/v1/jobs", headers={"Authorization": f"Bearer {API}"})


# -- mutual TLS -----------------------------------------------------------------------------


@pytest.fixture
async def mtls_address(core: CoordinatorCore, auth: AuthConfig,
                       certs: CertPaths) -> AsyncIterator[str]:
    reg = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                       CoordinatorServicer(core), NAME)
    mutual = dataclasses.replace(auth, tls_client_ca_file=str(certs.ca))
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=1.0),
                 [reg], mutual)
    await srv.start()
    yield f"127.0.0.1:{srv.port}"
    await srv.stop()


async def test_mutual_tls_takes_a_client_certificate_from_the_ca(
        mtls_address: str, certs: CertPaths) -> None:
    with_cert = ClientAuth(SERVICE, str(certs.ca), str(certs.client), str(certs.client_key))
    assert await _list(mtls_address, with_cert) == []
    assert await asyncio.to_thread(check, mtls_address, "", 5.0, str(certs.ca),
                                   str(certs.client), str(certs.client_key)) == "SERVING"


async def test_mutual_tls_refuses_a_caller_without_a_certificate(
        mtls_address: str, certs: CertPaths) -> None:
    with pytest.raises(Unavailable):
        await _list(mtls_address, ClientAuth(SERVICE, str(certs.ca)))


async def test_mutual_tls_refuses_a_certificate_from_another_ca(
        mtls_address: str, certs: CertPaths, tmp_path: Path) -> None:
    other = make_certs(tmp_path / "other")
    stranger = ClientAuth(SERVICE, str(certs.ca), str(other.client), str(other.client_key))
    with pytest.raises(Unavailable):
        await _list(mtls_address, stranger)


def test_tls_settings_that_go_together_are_checked(certs: CertPaths) -> None:
    from libra.grpc_auth import server_credentials

    with pytest.raises(ValueError, match="auth.tls_key_file"):
        server_credentials(AuthConfig(tls_cert_file=str(certs.server)))
    with pytest.raises(ValueError, match="auth.tls_client_ca_file needs"):
        server_credentials(AuthConfig(tls_client_ca_file=str(certs.ca)))
    with pytest.raises(ValueError, match="auth.tls_client_key_file"):
        ClientAuth("", str(certs.ca), tls_client_cert_file=str(certs.client)) \
            .channel_credentials()
