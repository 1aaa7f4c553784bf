"""`libra submit --priority`, `libra jobs`, `libra resume` against a real coordinator.

Real: the ``libra`` CLI (its own event loop, in a thread, as from a shell), the typed
gRPC client, an in-process ``grpc.aio`` server with the coordinator servicer and core
over ``RedisCoordinatorStore`` on the session's redis-server. Fakes: ``FakeRunner`` for
the trainer and scheduler clients.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from libra.clock import SystemClock
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra_cli.main import main
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner
from tests.service.grpc_harness import serving


@pytest.fixture
async def address(redis: Any, tmp_path: Path) -> AsyncIterator[str]:
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    add = coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server
    async with serving("coordinator", add, CoordinatorServicer(core), coordinator_pb2.DESCRIPTOR,
                       "CoordinatorService") as addr:
        yield addr
    await core.settle()


async def libra(capsys: pytest.CaptureFixture[str], address: str, *argv: str) -> tuple[int, Any]:
    """Run the CLI; returns its exit code and its --json output (or stderr text)."""
    code = await asyncio.to_thread(main, ["--coordinator", address, *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else err


async def test_submit_priority_jobs_positions_and_resume(
        address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('name = "cli"\n[algorithm]\nnum_steps = 2\n')
    _, running = await libra(capsys, address, "submit", str(spec), "--json")
    _, low = await libra(capsys, address, "submit", str(spec), "--json")
    code, high = await libra(capsys, address, "submit", str(spec), "--priority", "4", "--json")
    assert code == 0 and (running["state"], high["state"]) == ("running", "pending")
    _, rows = await libra(capsys, address, "jobs", "--json")
    assert {r["job_id"]: (r["queue_position"], r["priority"]) for r in rows} == {
        running["job_id"]: (0, 0), low["job_id"]: (2, 0), high["job_id"]: (1, 4)}

    code, err = await libra(capsys, address, "resume", running["job_id"], "--json")
    assert code == 2 and "FailedPrecondition" in err and "is running" in err
    await libra(capsys, address, "cancel", low["job_id"], "--json")
    code, err = await libra(capsys, address, "resume", low["job_id"])
    assert code == 2 and "no checkpoint" in err
    folder = tmp_path / "runs" / low["job_id"] / "checkpoints" / "step_000001"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text('{"step": 1, "policy_version": 0, "files": {}}')
    code, resumed = await libra(capsys, address, "resume", low["job_id"], "--json")
    assert code == 0
    assert (resumed["state"], resumed["queue_position"], resumed["num_resumes"]) == (
        "pending", 2, 1)


def test_help_names_the_queue_and_resume(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["resume", "--help"])
    assert "newest checkpoint" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    assert "--priority" in capsys.readouterr().out
