"""The in-process loop (libra_cli/inprocess_loop.py): the five cores in this process,
one embedded real Redis, the demo's tiny model on CPU. A short demo job runs to
SUCCEEDED with the accounting identity the stack tests check; a bad spec is refused
naming its field; `libra run --in-process` follows, reports and cleans up (Redis
stopped by pid, also when interrupted by SIGINT or SIGTERM)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers.modeling_utils import PreTrainedModel

from libra import types as t
from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_json
from libra_cli.inprocess_loop import in_process_stack
from libra_cli.main import main
from libra_cli.redis_server import pid_alive
from tests.integration.stack_helpers import (
    ROOT,
    assert_exact_accounting,
    small_job,
    wait_for_job,
)

pytestmark = pytest.mark.integration

REDIS_PID = Path(".libra") / "inprocess-redis" / "redis.pid"


async def test_a_demo_job_runs_in_process_to_succeeded_with_exact_accounting(
        tmp_path: Path) -> None:
    spec_json = small_job(policy="cmlfq")  # the demo's policy, its two buckets
    async with in_process_stack(tmp_path, job_spec_from_json(spec_json)) as inproc:
        client = inproc.coordinator
        workers = await client.list_workers()
        assert sorted((w.worker_id, w.bucket) for w in workers) == [
            ("rollout-0", "short"), ("rollout-1", "long")]
        bad = json.loads(spec_json)
        bad["algorithm"]["samples_per_prompt"] = 1
        with pytest.raises(InvalidArgument) as err:
            await client.create_job(json.dumps(bad), "json")
        assert err.value.field == "algorithm.samples_per_prompt"
        bad = json.loads(spec_json)
        bad["tools"]["enabled"] = ["no_such_tool"]  # checked against the gateway's registry
        with pytest.raises(InvalidArgument) as err:
            await client.create_job(json.dumps(bad), "json")
        assert err.value.field.startswith("tools.enabled")

        job = await client.create_job(spec_json, "json")
        job, steps, counters = await wait_for_job(client, job.job_id)
        assert job.state is t.JobState.SUCCEEDED, job.message
        assert [s["step"] for s in steps] == [1, 2, 3]
        assert counters["trained"] == 3 * 2 * 2
        assert steps[-1]["policy_version"] == 3
        report = assert_exact_accounting(inproc.redis_url, job, steps, counters)
        assert report["trained"] == counters["trained"]
        redis_pid = int((tmp_path / REDIS_PID).read_text())
    assert not pid_alive(redis_pid)  # the loop's Redis is stopped with it
    # The rollouts' and the trainer's model loads took turns: transformers' patches of
    # class attributes while loading (no tying, no init) were all undone.
    assert PreTrainedModel.tie_weights.__qualname__ == "PreTrainedModel.tie_weights"
    assert torch.nn.init.normal_.__name__ == "normal_"


def _job_file(tmp_path: Path, **algorithm: int) -> Path:
    path = tmp_path / "job.json"
    path.write_text(small_job(**algorithm))
    return path


def test_libra_run_in_process_follows_reports_and_stops(tmp_path: Path) -> None:
    # Its own process, as a user runs it (stdout carries only the JSON summary).
    run_root = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "libra_cli.main", "--run-root", str(run_root), "run",
         str(_job_file(tmp_path)), "--in-process", "--json", "--set",
         "algorithm.num_steps=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert (summary["state"], summary["steps"]) == ("succeeded", 2)
    assert json.loads(Path(summary["report"]).read_text())["trajectories"]["trained"] == 8
    assert not pid_alive(int((run_root / REDIS_PID).read_text()))


def test_libra_run_in_process_refuses_a_bad_spec_before_starting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_root = tmp_path / "runs"
    code = main(["--run-root", str(run_root), "run", str(_job_file(tmp_path)),
                 "--in-process", "--set", "algorithm.samples_per_prompt=1"])
    assert code == 2
    assert "algorithm.samples_per_prompt" in capsys.readouterr().err
    assert not (run_root / REDIS_PID).exists()  # nothing was started


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_stops_an_in_process_run_and_its_redis(tmp_path: Path,
                                                         signum: signal.Signals) -> None:
    run_root, err_path = tmp_path / "runs", tmp_path / "stderr.txt"
    with err_path.open("w") as err:  # a file, not a pipe: a full pipe would block it
        proc = subprocess.Popen(
            [sys.executable, "-m", "libra_cli.main", "--run-root", str(run_root), "run",
             str(_job_file(tmp_path, num_steps=500)), "--in-process", "--json"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 180.0  # the submit, whatever the machine's speed
        while "submitted (in-process)" not in err_path.read_text():
            assert proc.poll() is None, f"libra run exited with {proc.returncode}"
            assert time.monotonic() < deadline, "libra run never submitted its job"
            time.sleep(0.1)
        redis_pid = int((run_root / REDIS_PID).read_text())
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
        assert f"interrupted by {signum.name}; the in-process run stopped" in (
            err_path.read_text())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Stopped and reaped by the run's clean-up before it exited (no waiting here: the
    # server's parent-death signal alone would still be racing the exit).
    assert not pid_alive(redis_pid)
