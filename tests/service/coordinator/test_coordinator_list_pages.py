"""ListJobs returns summaries in bounded pages: many 1 MiB specs never exceed a client's
4 MiB limit, and `libra jobs` lists every job as before.

Real: the coordinator servicer and core over ``RedisCoordinatorStore`` on the session's
redis-server, in a ``grpc.aio`` server on a loopback socket; a plain ``grpc.aio`` channel
with gRPC's default 4 MiB receive limit (any client not written by us), the typed client
and the ``libra`` CLI; the REST app served by uvicorn. Jobs with ~1 MiB specs are stored
with the store's own ``put_job`` (a spec this size passes no submit: every field is at
most 64 KiB; the store holds what a bigger limit or an older coordinator wrote).
Fakes: ``FakeRunner`` for trainer and scheduler.
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
import uvicorn

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.errors import InvalidArgument
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra_cli.main import main as cli_main
from libra_cli.redis_server import free_port
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner
from tests.service.grpc_harness import serving

SPEC_BYTES = 1 << 20
DEFAULT_GRPC_LIMIT_BYTES = 4 * 1024 * 1024


@pytest.fixture
async def store(redis: Any) -> RedisCoordinatorStore:
    return RedisCoordinatorStore(redis, SystemClock())


@pytest.fixture
async def core(store: RedisCoordinatorStore, tmp_path: Path) -> AsyncIterator[CoordinatorCore]:
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), SystemClock(), tmp_path / "runs")
    yield core
    await core.settle()


@pytest.fixture
async def address(core: CoordinatorCore) -> AsyncIterator[str]:
    async with serving("coordinator", pb_grpc.add_CoordinatorServiceServicer_to_server,
                       CoordinatorServicer(core), pb.DESCRIPTOR, "CoordinatorService") as addr:
        yield addr


async def put_big_jobs(store: RedisCoordinatorStore, count: int) -> list[str]:
    ids = []
    for index in range(count):
        job_id = f"big-{index:08x}"
        spec = json.dumps({"name": "big", "padding": "x" * SPEC_BYTES})
        await store.put_job(t.Job(job_id=t.JobId(job_id), name="big",
                                  state=t.JobState.SUCCEEDED, spec_json=spec,
                                  created_at_ms=1_000 + index, updated_at_ms=2_000 + index,
                                  message="done", run_dir=f"/runs/{job_id}"))
        ids.append(job_id)
    return ids


async def test_ten_jobs_with_1_mib_specs_list_within_a_default_4_mib_client(
        store: RedisCoordinatorStore, address: str) -> None:
    ids = await put_big_jobs(store, 10)  # ~10 MiB of specs: whole jobs would not fit
    async with grpc.aio.insecure_channel(address) as channel:  # gRPC's default limits
        resp = await pb_grpc.CoordinatorServiceStub(channel).ListJobs(pb.ListJobsRequest())
    assert [job.job_id for job in resp.jobs] == ids and resp.next_page_token == ""
    assert all(job.spec_json == "" and job.message == "done" for job in resp.jobs)
    assert resp.ByteSize() < 10_000 < DEFAULT_GRPC_LIMIT_BYTES


async def test_pages_follow_each_other_and_the_client_lists_them_all(
        store: RedisCoordinatorStore, address: str) -> None:
    ids = await put_big_jobs(store, 7)
    client = GrpcCoordinatorClient(address, timeout_s=30.0)
    try:
        seen, token, pages = [], "", 0
        while True:
            page, token = await client.list_jobs_page(page_size=3, page_token=token)
            seen += [job.job_id for job in page]
            pages += 1
            if not token:
                break
        assert (seen, pages) == (ids, 3)
        assert [job.job_id for job in await client.list_jobs()] == ids
        full, _steps, _counters = await client.get_job(ids[0])
        assert len(full.spec_json) > SPEC_BYTES  # GetJob still has the whole spec
    finally:
        await client.close()


@pytest.mark.parametrize(("page_size", "page_token", "field"), [
    (-1, "", "page_size"), (501, "", "page_size"), (0, "not-a-token!", "page_token")])
async def test_bad_paging_input_is_invalid_argument_naming_the_field(
        address: str, page_size: int, page_token: str, field: str) -> None:
    client = GrpcCoordinatorClient(address, timeout_s=30.0)
    try:
        with pytest.raises(InvalidArgument) as err:
            await client.list_jobs_page(page_size, page_token)
        assert err.value.field == field
    finally:
        await client.close()


async def test_libra_jobs_still_lists_every_job(
        store: RedisCoordinatorStore, address: str, capsys: pytest.CaptureFixture[str]) -> None:
    ids = await put_big_jobs(store, 3)
    code = await asyncio.to_thread(cli_main, ["--coordinator", address, "jobs", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and [row["job_id"] for row in rows] == ids
    assert set(rows[0]) == {"job_id", "name", "state", "queue_position", "priority", "step",
                            "policy_version", "num_resumes", "message"}


async def test_rest_lists_summaries_in_pages(store: RedisCoordinatorStore,
                                             core: CoordinatorCore) -> None:
    ids = await put_big_jobs(store, 3)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(core), host="127.0.0.1", port=port,
                                           log_level="warning"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            first = await http.get("/v1/jobs", params={"page_size": 2})
            second = await http.get("/v1/jobs", params={
                "page_size": 2, "page_token": first.headers["Next-Page-Token"]})
            misspelt = await http.get("/v1/jobs", params={"page_sise": 2})
    finally:
        server.should_exit = True
        await task
    assert [j["job_id"] for j in first.json() + second.json()] == ids
    assert "Next-Page-Token" not in second.headers
    assert "spec" not in first.json()[0] and len(first.content) < 2_000
    assert misspelt.status_code == 400 and misspelt.json()["field"] == "page_sise"
