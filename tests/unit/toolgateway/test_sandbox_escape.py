"""A process that leaves the tool's process group does not hold the call.

The tool double-forks a child into its own session (``os.setsid``) that sleeps with the
tool's stdout and stderr inherited, then exits with status 3. Before, the sandbox waited
for the pipes' EOF (``Process.wait()`` on 3.11 waits for it) before it killed the uid's
processes, so the call ran into its backstop (budget + grace) and was reported as a
timeout with no output. Now the tool's own exit ends the call: the uid's leftovers are
killed (under the uid drop), the pipes get a bounded drain, and the call answers with the
tool's real exit status and output.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from libra.types import ToolStatus
from services.toolgateway.core import ToolCall, ToolGatewayCore
from services.toolgateway.sandbox import SandboxConfig, SubprocessSandbox
from tests.waiting import wait_until

BUDGET_MS = 60_000
# The call must end far before its budget: a load-proof margin (the tool itself exits
# in milliseconds).
PROMPT_MS = 30_000
# A direct sandbox run has no backstop: this guard fails the test instead of hanging.
GUARD_S = 90.0

ESCAPES_THEN_EXITS_3 = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"  # a new session: out of the tool's process group
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        time.sleep(600)\n"  # holds the inherited stdout and stderr open
    "        os._exit(0)\n"
    "    print(pid, flush=True)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "print('tool done', flush=True)\n"
    "sys.exit(3)\n")


def _is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def test_an_escaped_child_holding_the_pipes_does_not_hold_the_call(
        core: ToolGatewayCore) -> None:
    result = await core.execute(ToolCall("traj", "escape", "python",
                                         {"code": ESCAPES_THEN_EXITS_3}, BUDGET_MS))
    assert result.latency_ms < PROMPT_MS, result
    assert result.status is ToolStatus.FAILURE and result.error == "exit code 3", result
    escaped_pid, done = result.output.split("\n")[:2]
    assert done == "tool done"
    if os.geteuid() == 0:  # the uid drop: the escaped process is killed with its uid
        await wait_until(lambda: not _is_running(int(escaped_pid)))
    else:
        os.kill(int(escaped_pid), signal.SIGKILL)  # out of the sandbox's reach


async def test_the_sandbox_reports_the_tools_own_exit_status(
        sandbox: SubprocessSandbox) -> None:
    async with asyncio.timeout(GUARD_S):
        result = await sandbox.run(ESCAPES_THEN_EXITS_3, timeout_s=BUDGET_MS / 1000)
    if os.geteuid() != 0:
        os.kill(int(result.stdout.split("\n")[0]), signal.SIGKILL)  # out of its reach
    assert result.duration_ms < PROMPT_MS
    assert (result.status, result.exit_code, result.signal) == (ToolStatus.FAILURE, 3, None)
    assert "tool done\n" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="uid drop needs root")
async def test_killed_with_its_uid_the_escaped_child_leaves_the_output_whole(
        sandbox: SubprocessSandbox) -> None:
    """Under the uid drop the escaped child is killed, so the pipes end (EOF) and
    nothing is cut: the output is not marked truncated."""
    async with asyncio.timeout(GUARD_S):
        result = await sandbox.run(ESCAPES_THEN_EXITS_3, timeout_s=BUDGET_MS / 1000)
    assert not result.is_output_truncated and result.error == "exit code 3"


async def test_without_the_uid_drop_the_pipes_get_a_bounded_drain(readable_tmp: Path) -> None:
    """Without the uid drop the escaped child cannot be found to be killed: the pipes it
    holds are closed after ``kill_grace_s`` and the output counts as truncated, but the
    call still ends with the tool's exit status and what it printed."""
    sandbox = SubprocessSandbox(SandboxConfig(enable_uid_drop=False, kill_grace_s=0.5,
                                              work_root_dir=str(readable_tmp / "sandbox")))
    async with asyncio.timeout(GUARD_S):
        result = await sandbox.run(ESCAPES_THEN_EXITS_3, timeout_s=BUDGET_MS / 1000)
    escaped_pid = int(result.stdout.split("\n")[0])
    try:
        assert result.duration_ms < PROMPT_MS
        assert (result.status, result.exit_code) == (ToolStatus.FAILURE, 3)
        assert "tool done\n" in result.stdout and result.is_output_truncated
        assert _is_running(escaped_pid)  # nothing killed it: the drain was bounded
    finally:
        os.kill(escaped_pid, signal.SIGKILL)
