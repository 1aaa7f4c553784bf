"""The model check through the coordinator's gRPC and REST shells, and the CLI's submit.

Real: the core wired with ``check_job_model`` (as ``__main__.build_core`` wires it, which
one test uses itself), an in-process ``grpc.aio`` server on port 0, the typed client,
the FastAPI app, ``RedisCoordinatorStore`` on the session's redis-server, the ``libra``
CLI (run in a thread: it owns its event loop). Fakes: ``FakeRunner`` for the trainer and
scheduler clients.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import InvalidArgument
from libra_cli.main import main as cli_main
from services.coordinator.__main__ import build_core
from services.coordinator.config import CoordinatorConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.model_check import check_job_model
from services.coordinator.rest import build_app
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner


def hf_spec(path: Path | str) -> str:
    return (f'name = "hf"\n[model]\nkind = "hf"\npath = {json.dumps(str(path))}\n'
            '[algorithm]\nnum_steps = 2\n')


@pytest.fixture
def core(redis: Any, tmp_path: Path) -> CoordinatorCore:
    return CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs",
                           model_check=check_job_model)


async def test_grpc_bad_model_is_invalid_argument_and_nothing_is_created(
        client: GrpcCoordinatorClient, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        await client.create_job(hf_spec(tmp_path / "no-model"))
    assert err.value.field == "model.path" and "does not exist" in err.value.reason
    assert await client.list_jobs() == []


async def test_rest_bad_model_is_400_naming_the_field(core: CoordinatorCore,
                                                     tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    transport = httpx.ASGITransport(app=build_app(core))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        resp = await http.post("/v1/jobs", json={"spec": hf_spec(tmp_path / "empty")})
        assert resp.status_code == 400
        assert resp.json()["field"] == "model.path"
        assert "no config.json" in resp.json()["message"]
        assert (await http.get("/v1/jobs")).json() == []


async def test_cli_submit_sends_overrides_and_an_absolute_model_path(
        client: GrpcCoordinatorClient, hf_model_dir, tmp_path: Path, monkeypatch) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('name = "cli"\n[algorithm]\nnum_steps = 2\n')
    model_dir = hf_model_dir("qwen3")
    monkeypatch.chdir(model_dir.parent)
    argv = ["--coordinator", client.address, "submit", str(spec), "--json",
            "--set", "model.kind=hf", "--set", f"model.path={model_dir.name}",
            "--set", "algorithm.num_steps=5"]
    code = await asyncio.to_thread(cli_main, argv)
    assert code == 0
    (summary,) = await client.list_jobs()  # a summary: the spec comes with get_job
    job, _steps, _counters = await client.get_job(summary.job_id)
    submitted = json.loads(job.spec_json)
    assert submitted["model"]["path"] == str(model_dir)
    assert submitted["algorithm"]["num_steps"] == 5


async def test_the_service_wires_the_model_check(redis: Any, tmp_path: Path) -> None:
    core = build_core(CoordinatorConfig(run_root=str(tmp_path / "runs")), redis)
    with pytest.raises(InvalidArgument) as err:
        await core.create_job(hf_spec(tmp_path / "no-model"), "toml")
    assert err.value.field == "model.path"
    assert await core.list_jobs() == []
