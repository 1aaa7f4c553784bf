"""`libra gc` and the coordinator's retention pass against a real coordinator.

Real: the ``libra`` CLI (its own event loop, in a thread, as from a shell), the typed
gRPC client, an in-process ``grpc.aio`` server with the coordinator servicer and core
over ``RedisCoordinatorStore`` on the session's redis-server, real folders on disk.
Fakes: ``FakeRunner`` for the trainer and scheduler clients. A job's end time is set in
its Redis hash (``updated_at_ms``) so ages do not depend on the clock.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from libra import redis_keys as keys
from libra.clock import SystemClock
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.retention import RetentionPolicy
from libra.run_dir import published_versions, weights_file
from libra_cli.main import main
from services.coordinator.core import CoordinatorCore
from services.coordinator.retention import retention_pass
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from tests.fakes.runner import FakeRunner
from tests.service.grpc_harness import serving

DAY_S = 86400


@pytest.fixture
async def core(redis: Any, tmp_path: Path) -> AsyncIterator[CoordinatorCore]:
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    yield core
    await core.settle()


@pytest.fixture
async def address(core: CoordinatorCore) -> AsyncIterator[str]:
    add = coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server
    async with serving("coordinator", add, CoordinatorServicer(core), coordinator_pb2.DESCRIPTOR,
                       "CoordinatorService") as addr:
        yield addr


async def libra(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """Run the CLI; returns its exit code and its --json output (or stderr text)."""
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else err


def make_run(run_root: Path, job_id: str, num_versions: int = 4) -> Path:
    run_dir = run_root / job_id
    for version in range(num_versions):
        path = weights_file(run_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"w" * 1000)
    (run_dir / "checkpoints" / "step_000004").mkdir(parents=True)
    return run_dir


def age_folder(run_dir: Path, days: float) -> None:
    then = time.time() - days * DAY_S
    for path in (run_dir, *run_dir.iterdir()):
        os.utime(path, (then, then))


async def submitted(capsys: pytest.CaptureFixture[str], address: str, spec: Path,
                    cancel: bool = False) -> str:
    _, row = await libra(capsys, "--coordinator", address, "submit", str(spec), "--json")
    if cancel:
        await libra(capsys, "--coordinator", address, "cancel", row["job_id"], "--json")
    return row["job_id"]


async def set_ended_days_ago(redis: Any, job_id: str, days: float) -> None:
    await redis.hset(keys.job(job_id), "updated_at_ms", int((time.time() - days * DAY_S) * 1000))


async def test_gc_deletes_old_ended_runs_keeps_live_ones_and_prunes_weights(
        address: str, redis: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    spec = tmp_path / "job.toml"
    spec.write_text('name = "gc"\n[algorithm]\nnum_steps = 2\n')
    running = await submitted(capsys, address, spec)
    queued = await submitted(capsys, address, spec)
    old = await submitted(capsys, address, spec, cancel=True)
    recent = await submitted(capsys, address, spec, cancel=True)
    await set_ended_days_ago(redis, old, 10)
    await set_ended_days_ago(redis, running, 30)  # a live job is kept whatever its age
    dirs = {job_id: make_run(runs, job_id) for job_id in (running, queued, old, recent)}
    orphan_old, orphan_new = make_run(runs, "gone-0000aaaa"), make_run(runs, "lost-0000bbbb")
    age_folder(orphan_old, 11)  # Redis forgot these jobs: aged by their files
    age_folder(orphan_new, 1)
    (runs / ".libra" / "logs").mkdir(parents=True)
    base = ["--coordinator", address, "--run-root", str(runs), "gc", "--keep-last", "1",
            "--json"]

    code, preview = await libra(capsys, *base, "--dry-run")
    assert code == 0, preview
    actions = {row["job_id"]: row["action"] for row in preview["runs"]}
    assert actions == {running: "keep", queued: "keep", old: "delete", recent: "prune_weights",
                       "gone-0000aaaa": "delete", "lost-0000bbbb": "prune_weights"}
    assert preview["num_deleted"] == 2
    assert preview["freed_bytes"] == 2 * 4000 + 2 * 3000
    assert all(path.is_dir() for path in (*dirs.values(), orphan_old))  # a dry run

    code, done = await libra(capsys, *base)
    assert code == 0 and done["freed_bytes"] == preview["freed_bytes"]
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        [".libra", running, queued, recent, "lost-0000bbbb"])
    assert sorted(published_versions(dirs[recent])) == [3]
    assert (dirs[recent] / "checkpoints" / "step_000004").is_dir()
    assert sorted(published_versions(dirs[running])) == [0, 1, 2, 3]
    assert sorted(published_versions(dirs[queued])) == [0, 1, 2, 3]


@pytest.mark.parametrize(("flag", "value"), [("--older-than", "7x"), ("--older-than", "-1d"),
                                             ("--keep-last", "-1"),
                                             ("--keep-weight-versions", "-2")])
async def test_gc_refuses_a_bad_option_naming_it(
        address: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str,
        value: str) -> None:
    code, err = await libra(capsys, "--coordinator", address, "--run-root",
                            str(tmp_path / "runs"), "gc", f"{flag}={value}")
    assert code == 2 and f"InvalidArgument: {flag}" in err


def test_gc_without_a_stack_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no stack is running"):
        main(["--run-root", str(tmp_path), "gc"])


async def test_retention_pass_applies_the_coordinator_setting(
        core: CoordinatorCore, redis: Any, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = await core.create_job('name = "r"\n[algorithm]\nnum_steps = 2\n', "toml")
    second = await core.create_job('name = "r"\n[algorithm]\nnum_steps = 2\n', "toml")
    await core.cancel_job(first.job_id)
    await set_ended_days_ago(redis, first.job_id, 3)
    make_run(runs, first.job_id)
    make_run(runs, second.job_id)  # started when the first was cancelled: running
    policy = RetentionPolicy(max_age_s=2 * DAY_S, keep_last=0, keep_weight_versions=1)

    done = await retention_pass(core.list_jobs, runs, policy)
    assert [(a.job_id, a.action) for a in done] == [(first.job_id, "delete")]
    assert not (runs / first.job_id).exists()
    assert sorted(published_versions(runs / second.job_id)) == [0, 1, 2, 3]
    assert await retention_pass(core.list_jobs, runs, policy) == []


async def test_retention_pass_prunes_ended_weights_unless_the_spec_keeps_all(
        core: CoordinatorCore, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    pruned = await core.create_job('name = "p"\n[algorithm]\nnum_steps = 2\n', "toml")
    await core.cancel_job(pruned.job_id)
    keep_all = await core.create_job(
        'name = "k"\n[algorithm]\nnum_steps = 2\nkeep_weight_versions = 0\n', "toml")
    await core.cancel_job(keep_all.job_id)
    for job_id in (pruned.job_id, keep_all.job_id):
        make_run(runs, job_id)
    policy = RetentionPolicy(max_age_s=0, keep_last=0, keep_weight_versions=2)

    done = await retention_pass(core.list_jobs, runs, policy)
    assert [(a.job_id, a.action, a.prune_versions) for a in done] == [
        (pruned.job_id, "prune_weights", [0, 1])]
    assert sorted(published_versions(runs / pruned.job_id)) == [2, 3]
    assert sorted(published_versions(runs / keep_all.job_id)) == [0, 1, 2, 3]
