"""While Redis is unreachable the job API answers UNAVAILABLE / HTTP 503, not a 500.

Real: the coordinator core over ``RedisCoordinatorStore`` whose client points at a
loopback port where nothing listens (connection refused: Redis down, deterministic), the
gRPC servicer on a ``libra.grpcx.Server`` with the typed client over a socket, and the
REST app served by uvicorn on a socket. Fakes: ``FakeRunner`` for trainer and scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
import uvicorn
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import Unavailable
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra_cli.redis_server import free_port
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner
from tests.service.grpc_harness import serving

SPEC = 'name = "outage"\n[algorithm]\nnum_steps = 2\n'


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[CoordinatorCore]:
    dead = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0", decode_responses=True,
                             socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0))
    store = RedisCoordinatorStore(dead, SystemClock(), retry_attempts=1)
    yield CoordinatorCore(store, FakeRunner(), FakeRunner(), SystemClock(), tmp_path / "runs")
    await dead.aclose()


@pytest.fixture
async def rest_url(core: CoordinatorCore) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(core), host="127.0.0.1", port=port,
                                           log_level="warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/jobs", None),
    ("GET", "/v1/jobs/outage-0000abcd", None),
    ("POST", "/v1/jobs", {"spec": SPEC, "format": "toml"}),
    ("POST", "/v1/jobs/outage-0000abcd/cancel", None),
    ("GET", "/v1/jobs/outage-0000abcd/events", None),
    ("GET", "/v1/workers", None),
])
async def test_rest_answers_503_with_the_error_body(rest_url: str, method: str, path: str,
                                                    body: dict | None) -> None:
    async with httpx.AsyncClient(base_url=rest_url, timeout=30.0) as http:
        resp = await http.request(method, path, json=body)
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"] == "unavailable"
    assert "unreachable" in resp.json()["message"]
    assert resp.headers["Retry-After"] == "1"


async def test_grpc_answers_unavailable(core: CoordinatorCore) -> None:
    add = coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server
    async with serving("coordinator", add, CoordinatorServicer(core), coordinator_pb2.DESCRIPTOR,
                       "CoordinatorService") as address:
        client = GrpcCoordinatorClient(address, timeout_s=30.0)
        try:
            with pytest.raises(Unavailable, match="unreachable"):
                await client.list_jobs()
            with pytest.raises(Unavailable, match="unreachable"):
                await client.create_job(SPEC, "toml")
        finally:
            await client.close()


def test_openapi_lists_503_on_every_job_route(core: CoordinatorCore) -> None:
    doc = build_app(core).openapi()
    for path, ops in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for name, op in ops.items():
            answer = op["responses"].get("503")
            assert answer is not None, f"{name} {path}"
            assert answer["content"]["application/json"]["schema"]["$ref"].endswith(
                "/ErrorBody")
            assert "Retry-After" in answer["headers"]
