"""`libra run` interrupted mid-job (real processes): SIGTERM or SIGINT (Ctrl-C) cancels
the job, stops the stack it started by pid, and exits 128 + the signal with a message.
The job's state is then read from the stack's Redis data (AOF), with Redis alone."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra.errors import LibraError
from libra_cli import stack
from libra_cli.redis_server import pid_alive, start_redis
from tests.integration.stack_helpers import ROOT, small_job

pytestmark = pytest.mark.integration


async def wait_until_training(run_root: Path, proc: subprocess.Popen,
                              timeout_s: float = 180.0) -> tuple[dict, str]:
    """The stack's state and the job id, once the job has recorded a step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"libra run exited early with {proc.returncode}"
        state = stack.read_state(run_root)
        if state is not None:
            client = stack.coordinator_client(state, timeout_s=2.0)
            try:
                jobs = await client.list_jobs()
            except LibraError:
                jobs = []  # the stack is still coming up
            finally:
                await client.close()
            if jobs and jobs[0].step >= 1:
                return state, jobs[0].job_id
        await asyncio.sleep(0.2)
    raise AssertionError("the job never started training")


def stored_job(run_root: Path, job_id: str) -> dict[str, str]:
    """The job's hash as the stack's Redis persisted it (its own AOF, read back)."""
    server = start_redis(run_root / ".libra" / "redis")
    try:
        return redis_sync.from_url(server.url, decode_responses=True).hgetall(keys.job(job_id))
    finally:
        server.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_an_interrupted_libra_run_cancels_its_job_and_stops_its_stack(
        tmp_path: Path, signum: signal.Signals) -> None:
    run_root = tmp_path / "runs"
    job_file = tmp_path / "job.json"
    job_file.write_text(small_job(num_steps=10_000))  # still running when interrupted
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "libra_cli.main", "--run-root",
                                 str(run_root), "run", str(job_file), "--json"], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        state, job_id = await wait_until_training(run_root, proc)
        pids = [s["pid"] for s in state["services"]]
        pids += [state["redis_pid"], state["supervisor_pid"]]
        sent_at = time.monotonic()
        proc.send_signal(signum)
        code = await asyncio.to_thread(proc.wait, 90)
    finally:
        if proc.poll() is None:  # the test failed: do not leave the stack behind
            proc.kill()
            stack.down(run_root)
    print(f"\n[cleanup] libra run exited {time.monotonic() - sent_at:.1f}s after "
          f"{signum.name}")
    err = stderr_path.read_text()
    assert code == 128 + signum, err
    assert f"interrupted by {signum.name}; job {job_id} cancelled" in err
    assert "stack stopped" in err
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert stack.read_state(run_root) is None
    job = stored_job(run_root, job_id)
    assert job["state"] == "cancelled"
    assert job["message"] == f"libra run interrupted ({signum.name})"
