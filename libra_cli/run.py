"""``libra run``: start the stack, submit the job, follow it, report, stop the stack.

Interrupted by SIGINT (Ctrl-C) or SIGTERM at any point, it cleans up after itself:
the job, once submitted (a submit in flight is waited for), is cancelled with the
signal as its reason; the stack this command started is stopped by pid, as ``libra
down`` does (not with ``--keep-up``, nor a stack that was already up); and it exits
128 + the signal number (130, 143) with a message saying what it did. A further
signal during that clean-up is noted, not obeyed: the clean-up finishes.

A stack this command starts is its own, so a job found there not yet ended - left
by an earlier run whose stack went away (a crash, a kill -9) and taken up again by
the restarted trainer - would only refuse the new submit: it is cancelled first,
with a reason, and named on stderr. (``libra up`` leaves such a job running.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.errors import LibraError
from libra_cli import credentials, stack
from libra_cli.report import reward_windows

# Longest wait for a CreateJob in flight when the signal came, to learn its job id.
SUBMIT_WAIT_S = 30.0
# How long `libra run` keeps following a job while the coordinator does not answer.
FOLLOW_OUTAGE_S = 120.0
LEFTOVER_REASON = "left over from an earlier run whose stack went away; cancelled by libra run"


class Interrupted(BaseException):
    """SIGINT or SIGTERM while ``libra run`` was in blocking code (starting the stack).

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """SIGINT/SIGTERM handling in three modes.

    ``raise`` (from ``install``): the handler raises :class:`Interrupted` (blocking code).
    ``cancel``: it cancels the registered asyncio task from the loop (as asyncio.Runner
    does for SIGINT), so the task can cancel the job before it ends. ``hold``: the
    signal is only noted (clean-up under way). Only the first signal is acted upon.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._mode = "raise"
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def cancel_on_signal(self, task: asyncio.Task) -> None:
        self._task, self._loop, self._mode = task, task.get_loop(), "cancel"

    def hold(self) -> None:
        self._mode = "hold"

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None:
            print(f"libra: {signal.Signals(signum).name} noted; still cleaning up ...",
                  file=sys.stderr)
            return
        self.signum = signum
        if self._mode == "raise":
            raise Interrupted(signum)
        if self._mode == "cancel" and self._loop is not None:
            # Cancel from the loop, not from inside whatever the handler interrupted.
            self._loop.call_soon_threadsafe(self._cancel_if_armed)

    def _cancel_if_armed(self) -> None:
        if self._mode == "cancel" and self._task is not None:
            self._task.cancel()


def cmd_run(args: argparse.Namespace, load: Callable[[argparse.Namespace], dict[str, Any]],
            report: Callable[..., Awaitable[dict[str, Any]]],
            show: Callable[[Any, bool], None]) -> int:
    """The command; ``load`` validates the spec (before anything starts), ``report`` is
    main.py's report writer (shared with ``libra report``), ``show`` its printer."""
    data = load(args)
    was_up = stack.read_state(args.run_root) is not None
    stops_stack = not was_up and not args.keep_up
    interrupts = Interrupts()
    interrupts.install()
    code, summary = 2, None  # what an exception leaves (main() prints LibraErrors)
    try:
        print(f"libra: starting the stack (logs in {args.run_root / '.libra' / 'logs'}) ...",
              file=sys.stderr)
        state = stack.up(args.run_root)
        auth = credentials.cli_auth(args)
        session = RunSession(args, data, state, interrupts, owns_stack=not was_up,
                             connect=lambda address: GrpcCoordinatorClient(address, auth=auth))
        code, summary = asyncio.run(session.run(report))
    except Interrupted as exc:
        code, summary = 128 + exc.signum, None
        print(f"libra: interrupted by {exc} before a job was submitted", file=sys.stderr)
    finally:
        interrupts.hold()
        if stops_stack:
            stack.down(args.run_root)
            if code != 0 and summary is None:
                print("libra: stack stopped", file=sys.stderr)
        interrupts.restore()
    if summary is not None:
        show(summary, args.json)
    return code


def cmd_run_in_process(args: argparse.Namespace,
                       load: Callable[[argparse.Namespace], dict[str, Any]],
                       report: Callable[..., Awaitable[dict[str, Any]]],
                       show: Callable[[Any, bool], None]) -> int:
    """``libra run --in-process``: the five cores in this process over a throwaway Redis
    (libra_cli/inprocess_loop.py), no servers; then the same following and report.

    SIGINT (also where it was inherited ignored, as ``libra run`` does) and SIGTERM
    cancel the run: the cores are drained and Redis is stopped by pid; the exit code is
    128 + the signal."""
    data = load(args)
    # Every weight load would draw a progress bar here (the services' go to log files).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    signals: list[int] = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, summary = asyncio.run(_run_in_process(args, data, report, signals))
    except (KeyboardInterrupt, asyncio.CancelledError, Interrupted):
        signum = signals[0] if signals else signal.SIGINT
        print(f"libra: interrupted by {signal.Signals(signum).name}; the in-process run "
              "stopped", file=sys.stderr)
        return 128 + signum
    finally:
        signal.signal(signal.SIGINT, previous)
    show(summary, args.json)
    return code


async def _run_in_process(args: argparse.Namespace, data: dict[str, Any],
                          report: Callable[..., Awaitable[dict[str, Any]]],
                          signals: list[int]) -> tuple[int, dict[str, Any]]:
    # Imported here: the services' modules (and torch) load only for this command.
    from libra.jobspec import job_spec_from_dict
    from libra_cli.inprocess_loop import in_process_stack

    task = asyncio.current_task()
    assert task is not None

    def on_signal(signum: int) -> None:
        signals.append(signum)
        task.cancel()  # interrupts the start-up (model loads) too

    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, on_signal, signum)
    async with in_process_stack(args.run_root, job_spec_from_dict(data)) as inproc:
        client = inproc.coordinator
        started = time.monotonic()
        job = await client.create_job(json.dumps(data), "json")
        print(f"libra: job {job.job_id} submitted (in-process)", file=sys.stderr)
        # `follow` also checks the flag: a cancellation can be lost on its way through the
        # cores' awaits (seen about 1 in 6 under load: the job then ran to its end).
        job = await follow(client, job, args.json, interrupted=lambda: signals[0] if signals else 0)
        rep = await report(client, job.job_id, time.monotonic() - started)
    return (0 if job.state is t.JobState.SUCCEEDED else 1), _summary(job, rep)


class RunSession:
    """Submit, follow and report one job on a running stack; cancel it if interrupted.

    ``connect`` makes the coordinator client from its address (tests pass a fake).
    """

    def __init__(self, args: argparse.Namespace, data: dict[str, Any],
                 state: dict[str, Any], interrupts: Interrupts, owns_stack: bool,
                 connect: Callable[[str], Any] = GrpcCoordinatorClient) -> None:
        self.args = args
        self.data = data
        self.state = state
        self.interrupts = interrupts
        self.owns_stack = owns_stack
        self._connect = connect

    async def run(self, report: Callable[..., Awaitable[dict[str, Any]]]
                  ) -> tuple[int, dict[str, Any] | None]:
        client = self._connect(stack.coordinator_address(self.state))
        task = asyncio.current_task()
        assert task is not None
        self.interrupts.cancel_on_signal(task)
        started = time.monotonic()
        submit = asyncio.ensure_future(self._submit(client, json.dumps(self.data)))
        try:
            job = await asyncio.shield(submit)
            print(f"libra: job {job.job_id} submitted", file=sys.stderr)
            job = await follow(client, job, self.args.json)
            rep = await report(client, job.job_id, time.monotonic() - started)
            self.interrupts.hold()
            return (0 if job.state is t.JobState.SUCCEEDED else 1), _summary(job, rep)
        except asyncio.CancelledError:
            if self.interrupts.signum is None:
                raise
            self.interrupts.hold()
            await self._cancel(client, submit)
            return 128 + self.interrupts.signum, None
        finally:
            await client.close()

    async def _submit(self, client: GrpcCoordinatorClient, spec_json: str) -> t.Job:
        if self.owns_stack:
            await self._cancel_leftovers(client)
        return await client.create_job(spec_json, "json")

    async def _cancel_leftovers(self, client: GrpcCoordinatorClient) -> None:
        for job in await client.list_jobs():
            if not job.state.is_terminal:
                was = f"{job.state.value} at step {job.step}"
                await client.cancel_job(job.job_id, LEFTOVER_REASON)
                print(f"libra: cancelled job {job.job_id} ({was}), {LEFTOVER_REASON}; its "
                      f"run folder stays: {job.run_dir}", file=sys.stderr)

    async def _cancel(self, client: GrpcCoordinatorClient, submit: asyncio.Future) -> None:
        """Cancel the submitted job (waiting for a submit in flight to learn its id)."""
        name = self.interrupts.name
        try:
            async with asyncio.timeout(SUBMIT_WAIT_S):
                job = await submit
        except (LibraError, TimeoutError) as exc:
            print(f"libra: interrupted by {name}; no job was submitted ({exc})",
                  file=sys.stderr)
            return
        try:
            job = await client.cancel_job(job.job_id, f"libra run interrupted ({name})")
        except LibraError as exc:
            print(f"libra: interrupted by {name}; could not cancel job {job.job_id}: {exc}",
                  file=sys.stderr)
            return
        print(f"libra: interrupted by {name}; job {job.job_id} {job.state.value} at step "
              f"{job.step}", file=sys.stderr)


async def follow(client: GrpcCoordinatorClient, job: t.Job, quiet: bool,
                 interrupted: Callable[[], int] | None = None) -> t.Job:
    """Poll the job until it ends, drawing a progress bar (step, reward, traj/s, version);
    raise ``Interrupted`` as soon as ``interrupted()`` returns a signal number."""
    from tqdm import tqdm

    total = json.loads(job.spec_json)["algorithm"]["num_steps"]
    bar = tqdm(total=total, desc=job.name, unit="step", disable=quiet, dynamic_ncols=True)
    started = time.monotonic()
    failing_since: float | None = None
    try:
        while True:
            if interrupted is not None and (signum := interrupted()):
                raise Interrupted(signum)
            try:
                job, steps, counters = await client.get_job(job.job_id)
            except LibraError as exc:
                # A coordinator that is busy or restarting is not the job's end: keep
                # following (the services retry too) unless it stays gone for long.
                failing_since = failing_since or time.monotonic()
                if not exc.retryable or time.monotonic() - failing_since > FOLLOW_OUTAGE_S:
                    raise
                bar.set_postfix_str(f"coordinator unreachable ({exc}); retrying")
                await asyncio.sleep(1.0)
                continue
            failing_since = None
            bar.update(job.step - bar.n)
            if steps:
                rate = counters.get("trained", 0) / max(time.monotonic() - started, 1e-9)
                bar.set_postfix(reward=f"{steps[-1]['reward_mean']:.2f}",
                                traj_s=f"{rate:.1f}", version=job.policy_version)
            elif not quiet:
                bar.set_postfix_str("warming up (supervised warm start)")
            if job.state.is_terminal:
                return job
            await asyncio.sleep(0.5)
    finally:
        bar.close()  # also when interrupted: the messages after it start on a new line


def _summary(job: t.Job, report: dict[str, Any]) -> dict[str, Any]:
    first, last = reward_windows(report["steps"])
    evals = report.get("eval", [])
    held_out = {"eval_rounds": len(evals), "eval_accuracy_first": evals[0]["accuracy"],
                "eval_accuracy_last": evals[-1]["accuracy"]} if evals else {}
    return {"job_id": job.job_id, "state": job.state.value, "message": job.message,
            "steps": len(report["steps"]), "wall_s": report["wall_s"],
            "reward_first_10pct": round(first, 3), "reward_last_10pct": round(last, 3),
            "trajectories_per_s": report["throughput"]["trajectories_per_s"],
            **held_out, **report["_paths"]}
