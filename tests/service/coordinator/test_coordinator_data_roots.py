"""``tools.search_corpus`` is checked at submit against the coordinator's
``tool_data_roots`` (as ``__main__.corpus_check`` wires it), through the real gRPC and
REST shells: a file outside the roots is INVALID_ARGUMENT / HTTP 400 naming
``tools.search_corpus[i]`` and nothing is created; a file inside is accepted.

Real: the core, ``RedisCoordinatorStore`` on the session's redis-server, an in-process
``grpc.aio`` server on port 0, the typed client, the FastAPI app, files and symlinks
under tmp_path. Fakes: ``FakeRunner`` for the trainer and scheduler clients.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import InvalidArgument
from services.coordinator.__main__ import corpus_check
from services.coordinator.config import CoordinatorConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner


def spec(*corpus: str) -> str:
    return json.dumps({"name": "kb", "tools": {"search_corpus": list(corpus)},
                       "algorithm": {"num_steps": 2}})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "root"
    data.mkdir()
    (data / "kb.txt").write_text("Paris is the capital of France.\n")
    (tmp_path / "secret.txt").write_text("root:x:0:0\n")
    return data


@pytest.fixture
def core(redis: Any, tmp_path: Path, root: Path) -> CoordinatorCore:
    cfg = CoordinatorConfig(tool_data_roots=[str(root)])
    return CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs",
                           corpus_check=corpus_check(cfg))


async def refused(client: GrpcCoordinatorClient, *corpus: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        await client.create_job(spec(*corpus), "json")
    assert await client.list_jobs() == []
    return err.value


async def test_grpc_a_file_outside_the_roots_is_invalid_argument_naming_the_entry(
        client: GrpcCoordinatorClient, root: Path) -> None:
    err = await refused(client, str(root / "kb.txt"), str(root.parent / "secret.txt"))
    assert err.grpc_status_name == "INVALID_ARGUMENT"
    assert err.field == "tools.search_corpus[1]" and "outside the tool data roots" in err.reason
    assert str(root) in err.reason


async def test_grpc_host_files_are_refused(client: GrpcCoordinatorClient) -> None:
    assert (await refused(client, "/etc/shadow")).field == "tools.search_corpus[0]"


async def test_grpc_a_symlink_pointing_outside_is_refused(client: GrpcCoordinatorClient,
                                                          root: Path) -> None:
    (root / "link.txt").symlink_to(root.parent / "secret.txt")
    assert (await refused(client, str(root / "link.txt"))).field == "tools.search_corpus[0]"


async def test_grpc_a_dotdot_escape_is_refused(client: GrpcCoordinatorClient,
                                               root: Path) -> None:
    err = await refused(client, f"{root}/../secret.txt")
    assert err.field == "tools.search_corpus[0]"


async def test_grpc_a_file_inside_the_roots_is_accepted(client: GrpcCoordinatorClient,
                                                        root: Path) -> None:
    job = await client.create_job(spec(str(root / "kb.txt")), "json")
    assert json.loads(job.spec_json)["tools"]["search_corpus"] == [str(root / "kb.txt")]


async def test_rest_a_file_outside_the_roots_is_400_naming_the_entry(
        core: CoordinatorCore, root: Path) -> None:
    transport = httpx.ASGITransport(app=build_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        resp = await http.post("/v1/jobs", json={"spec": spec("/etc/passwd"), "format": "json"})
        assert resp.status_code == 400
        assert resp.json()["field"] == "tools.search_corpus[0]"
        assert (await http.get("/v1/jobs")).json() == []
