"""`libra run` interrupted: the job is cancelled, the stack it started is stopped.

Fakes: ``FakeJobApi`` below replaces the coordinator client (jobs in a dict; the submit
can be held at a gate); ``stack.up``/``stack.down`` and ``subprocess.Popen`` are
replaced where a test says so. Signals are delivered by calling the handler (or, once,
``signal.raise_signal``), so nothing depends on timing. The real-process version is
tests/integration/test_run_interrupted.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from libra import types as t
from libra_cli import run, stack
from libra_cli.run import LEFTOVER_REASON, Interrupted, Interrupts, RunSession

STATE = {"services": [{"name": "coordinator", "port": 1}]}


class FakeJobApi:
    """The coordinator client as `libra run` uses it; jobs never end by themselves."""

    def __init__(self, *existing: t.Job) -> None:
        self.jobs = {job.job_id: job for job in existing}
        self.cancelled: list[tuple[str, str]] = []
        self.submit_gate: asyncio.Event | None = None
        self.num_polls = 0

    async def list_jobs(self) -> list[t.Job]:
        return list(self.jobs.values())

    async def create_job(self, spec: str, spec_format: str) -> t.Job:
        if self.submit_gate is not None:
            await self.submit_gate.wait()
        job = make_job(f"job-{len(self.jobs)}", t.JobState.RUNNING)
        self.jobs[job.job_id] = job
        return job

    async def get_job(self, job_id: str) -> tuple[t.Job, list, dict]:
        self.num_polls += 1
        return self.jobs[job_id], [], {}

    async def cancel_job(self, job_id: str, reason: str = "") -> t.Job:
        self.cancelled.append((job_id, reason))
        job = self.jobs[job_id]
        job.state, job.message = t.JobState.CANCELLED, reason
        return job

    async def close(self) -> None:
        pass


def make_job(job_id: str, state: t.JobState) -> t.Job:
    return t.Job(job_id=t.JobId(job_id), name="n", state=state,
                 spec_json=json.dumps({"algorithm": {"num_steps": 5}}), created_at_ms=0,
                 updated_at_ms=0, step=2, run_dir=f"/runs/{job_id}")


def make_session(api: FakeJobApi, interrupts: Interrupts,
                 owns_stack: bool = True) -> RunSession:
    args = argparse.Namespace(json=True)
    return RunSession(args, {"name": "n"}, STATE, interrupts, owns_stack,
                      connect=lambda _address: api)


async def no_report(*_args: Any) -> dict[str, Any]:
    raise AssertionError("an interrupted run writes no report")


async def start(session: RunSession) -> asyncio.Task:
    task = asyncio.create_task(session.run(no_report))
    for _ in range(100):
        await asyncio.sleep(0)
    return task


# -- the job ----------------------------------------------------------------------------


async def test_a_signal_while_following_cancels_the_job_with_the_signal_as_reason(
        capsys: pytest.CaptureFixture) -> None:
    api, interrupts = FakeJobApi(), Interrupts()
    task = await start(make_session(api, interrupts))
    assert api.num_polls >= 1  # following the job
    interrupts._on_signal(signal.SIGTERM, None)
    code, summary = await task
    assert (code, summary) == (143, None)
    assert api.cancelled == [("job-0", "libra run interrupted (SIGTERM)")]
    assert "interrupted by SIGTERM; job job-0 cancelled" in capsys.readouterr().err


async def test_a_signal_during_the_submit_waits_for_it_then_cancels_the_job() -> None:
    api, interrupts = FakeJobApi(), Interrupts()
    api.submit_gate = asyncio.Event()
    task = await start(make_session(api, interrupts))
    interrupts._on_signal(signal.SIGINT, None)
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()  # the submit in flight may have created a job: wait for it
    api.submit_gate.set()
    assert (await task)[0] == 130
    assert api.cancelled == [("job-0", "libra run interrupted (SIGINT)")]


async def test_a_second_signal_during_the_clean_up_is_noted_not_obeyed(
        capsys: pytest.CaptureFixture) -> None:
    interrupts = Interrupts()
    interrupts.hold()
    interrupts._on_signal(signal.SIGINT, None)
    interrupts._on_signal(signal.SIGINT, None)  # nothing raised
    assert interrupts.signum == signal.SIGINT
    assert "SIGINT noted; still cleaning up" in capsys.readouterr().err


def test_a_signal_in_blocking_code_raises_interrupted() -> None:
    interrupts = Interrupts()
    interrupts.install()
    try:
        with pytest.raises(Interrupted) as info:
            signal.raise_signal(signal.SIGTERM)
        assert info.value.signum == signal.SIGTERM
    finally:
        interrupts.restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


async def test_jobs_left_on_a_stack_this_run_started_are_cancelled_before_the_submit(
        capsys: pytest.CaptureFixture) -> None:
    api = FakeJobApi(make_job("old", t.JobState.RUNNING), make_job("done", t.JobState.FAILED))
    interrupts = Interrupts()
    task = await start(make_session(api, interrupts, owns_stack=True))
    assert api.cancelled == [("old", LEFTOVER_REASON)]
    assert "cancelled job old (running at step 2)" in capsys.readouterr().err
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_jobs_on_a_stack_that_was_already_up_are_left_alone() -> None:
    api = FakeJobApi(make_job("theirs", t.JobState.RUNNING))
    task = await start(make_session(api, Interrupts(), owns_stack=False))
    assert api.cancelled == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- the stack --------------------------------------------------------------------------


def run_args(tmp_path: Path, keep_up: bool = False) -> argparse.Namespace:
    return argparse.Namespace(run_root=tmp_path, keep_up=keep_up, json=True)


def test_interrupted_while_the_stack_starts_stops_it_and_exits_128_plus_signal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    downs: list[Path] = []

    def up(_run_root: Path) -> dict:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(stack, "up", up)
    monkeypatch.setattr(stack, "down", lambda root: downs.append(root) or True)
    code = run.cmd_run(run_args(tmp_path), lambda _a: {}, no_report, lambda *_: None)
    assert code == 143 and downs == [tmp_path]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_keep_up_leaves_the_stack_running_when_interrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    downs: list[Path] = []

    def up(_run_root: Path) -> dict:
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(stack, "up", up)
    monkeypatch.setattr(stack, "down", lambda root: downs.append(root) or True)
    code = run.cmd_run(run_args(tmp_path, keep_up=True), lambda _a: {}, no_report,
                       lambda *_: None)
    assert code == 130 and downs == []


class FakeSupervisor:
    """``subprocess.Popen`` of the launcher: records the signals sent to it."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.signals: list[int] = []
        self.returncode: int | None = None
        FakeSupervisor.last = self

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)
        self.returncode = -signum

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode


def test_up_interrupted_while_waiting_stops_the_supervisor_it_started_by_pid(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted_wait(_run_root: Path, _timeout_s: float) -> dict:
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(subprocess, "Popen", FakeSupervisor)
    monkeypatch.setattr(stack, "_wait_until_serving", interrupted_wait)
    with pytest.raises(Interrupted):
        stack.up(tmp_path)
    assert FakeSupervisor.last.signals == [signal.SIGTERM]
