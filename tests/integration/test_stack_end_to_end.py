"""The spine end to end: `libra up` starts Redis and five service processes; a short job
runs to completion through them, trajectories travel through Redis and the policy
version advances; `libra down` stops everything by pid."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra import types as t
from libra.errors import InvalidArgument
from libra_cli import stack
from libra_cli.redis_server import pid_alive
from tests.integration.stack_helpers import ROOT, small_job, wait_for_job

pytestmark = pytest.mark.integration


@pytest.fixture
def running_stack(shared_stack: dict) -> dict:
    """The package's shared stack (conftest.py), for the tests that only submit and read."""
    return shared_stack


@pytest.fixture
def own_stack(shared_stack_to_break: dict) -> dict:
    """For the tests that kill a rollout and stop everything: the shared stack, after
    every other test on it (conftest.py), so its end is theirs."""
    return shared_stack_to_break


async def test_short_job_runs_through_redis_and_advances_policy(running_stack: dict) -> None:
    client = stack.coordinator_client(running_stack)
    job = await client.create_job(small_job(), "json")
    job, steps, counters = await wait_for_job(client, job.job_id)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert counters["trained"] == 3 * 2 * 2
    r = redis_sync.from_url(running_stack["redis_url"])
    assert r.xlen(keys.trajectories(job.job_id)) >= counters["trained"]
    assert int(r.hget(keys.policy(job.job_id), "version")) == 3
    assert steps[-1]["policy_version"] == 3
    await client.close()


async def test_invalid_spec_is_refused_naming_the_field(running_stack: dict) -> None:
    client = stack.coordinator_client(running_stack)
    spec = json.loads(small_job())
    spec["algorithm"]["samples_per_prompt"] = 1
    with pytest.raises(InvalidArgument) as err:
        await client.create_job(json.dumps(spec), "json")
    assert err.value.field == "algorithm.samples_per_prompt"
    # A composite reward's parts are checked at submit against the rewards the gateway
    # registered (over ListRewards). A composite job's per-step component means are
    # tested end to end by test_example_jobs.py (receipts-composite).
    spec = json.loads(small_job())
    spec["reward"] = {"name": "composite", "components": [
        {"name": "exact_match", "weight": 1.0}, {"name": "no_such_reward", "weight": 0.5}]}
    with pytest.raises(InvalidArgument) as err:
        await client.create_job(json.dumps(spec), "json")
    assert err.value.field == "reward.components[1].name"
    assert "has no reward 'no_such_reward' (it has: code_tests, composite" in err.value.reason
    await client.close()


def test_status_json_lists_every_service_healthy(running_stack: dict) -> None:
    out = subprocess.run([sys.executable, "-m", "libra_cli.main", "--run-root",
                          running_stack["run_root"], "status", "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    status = json.loads(out.stdout)
    # job: the running job's counters, or null; error: null when the coordinator answered
    assert set(status) == {"services", "job", "error"} and status["error"] is None
    rows = {row["name"]: row for row in status["services"]}
    assert set(rows) == {"coordinator", "scheduler", "trainer", "toolgateway", "rollout-0",
                         "rollout-1"}
    assert all(row["health"] == "SERVING" and row["pid"] > 0 for row in rows.values())
    for row in rows.values():
        assert Path(row["log"]).exists()


async def test_the_local_stack_is_locked_and_the_cli_holds_the_keys(
        running_stack: dict) -> None:
    """`libra up` generated tokens and a Redis password (0600 in the run root): every
    door refuses a caller without them, while the CLI finds them by itself."""
    import httpx

    from libra.clients.coordinator import GrpcCoordinatorClient
    from libra.clients.toolgateway import GrpcToolGatewayClient
    from libra.errors import PermissionDenied, Unauthenticated
    from libra.grpc_auth import ClientAuth
    from libra_cli.stack_secrets import secrets_dir

    run_root = Path(running_stack["run_root"])
    secret_files = sorted(secrets_dir(run_root).iterdir())
    assert [p.name for p in secret_files] == ["api_token", "redis_password", "service_token"]
    assert {p.stat().st_mode & 0o777 for p in secret_files} == {0o600}
    assert stack.state_path(run_root).stat().st_mode & 0o777 == 0o600
    api = (secrets_dir(run_root) / "api_token").read_text().strip()
    address = stack.coordinator_address(running_stack)
    anonymous = GrpcCoordinatorClient(address, timeout_s=5.0)
    public = GrpcCoordinatorClient(address, timeout_s=5.0, auth=ClientAuth(api))
    gateway = next(s for s in running_stack["services"] if s["name"] == "toolgateway")
    tools = GrpcToolGatewayClient(f"127.0.0.1:{gateway['port']}", auth=ClientAuth(api))
    try:
        with pytest.raises(Unauthenticated):
            await anonymous.list_jobs()
        assert isinstance(await public.list_jobs(), list)
        with pytest.raises(PermissionDenied):
            await public.report_step("job-x", {"step": 1, "policy_version": 1})
        with pytest.raises(PermissionDenied):
            await tools.list_tools()
    finally:
        for client in (anonymous, public, tools):
            await client.close()
    coord = next(s for s in running_stack["services"] if s["name"] == "coordinator")
    http_port = next(a.split("=", 1)[1] for a in coord["args"] if a.startswith("--http-port="))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}") as http:
        assert (await http.get("/v1/jobs")).status_code == 401
        ok = await http.get("/v1/jobs", headers={"Authorization": f"Bearer {api}"})
        assert ok.status_code == 200
    redis_port = int(running_stack["redis_url"].rsplit(":", 1)[1].split("/")[0])
    with redis_sync.Redis(port=redis_port) as no_password:
        with pytest.raises(redis_sync.AuthenticationError):
            no_password.ping()
    cli = subprocess.run([sys.executable, "-m", "libra_cli.main", "--run-root", str(run_root),
                          "jobs", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert isinstance(json.loads(cli.stdout), list)


async def test_rollout_killed_mid_trajectory_is_requeued(own_stack: dict) -> None:
    """kill -9 a rollout instance holding trajectories: after its lease expires the
    scheduler re-places them on the other instance and the job still completes."""
    client = stack.coordinator_client(own_stack)
    job = await client.create_job(small_job(num_steps=8), "json")
    r = redis_sync.from_url(own_stack["redis_url"], decode_responses=True)
    victim = next(s for s in own_stack["services"] if s["name"] == "rollout-1")
    for _ in range(600):
        if "rollout-1" in r.hvals(keys.assignments(job.job_id)):
            break
        await asyncio.sleep(0.05)
    os.kill(victim["pid"], signal.SIGKILL)
    job, steps, counters = await wait_for_job(client, job.job_id)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert counters.get("requeued", 0) >= 1
    assert len(steps) == 8
    assert "rollout-1" not in r.hvals(keys.assignments(job.job_id))
    await client.close()


def test_down_stops_every_process_by_pid(own_stack: dict) -> None:
    run_root = Path(own_stack["run_root"])
    pids = [s["pid"] for s in own_stack["services"]]
    pids += [own_stack["redis_pid"], own_stack["supervisor_pid"]]
    assert stack.down(run_root)
    assert not any(pid_alive(pid) for pid in pids)
    assert stack.read_state(run_root) is None

