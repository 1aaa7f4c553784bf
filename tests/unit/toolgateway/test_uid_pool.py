"""Sandbox uids are exclusive host-wide (two pools on one lock dir never share a uid),
and a uid goes out again only once no process of it remains."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from libra.types import ToolStatus
from services.toolgateway.isolation import UidPool, uids_with_processes
from services.toolgateway.sandbox import SandboxConfig, SubprocessSandbox
from tests.waiting import wait_until

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="processes of another uid need root")
# Apart from the session sandbox's uids (990_000...) and from each other's.
POOL_UID = 992_000
SANDBOX_UID = 991_000


def test_two_pools_never_hand_out_the_same_uid(tmp_path):
    a, b = UidPool(5000, 3, str(tmp_path)), UidPool(5000, 3, str(tmp_path))
    held_a = [a.acquire(), a.acquire()]
    held_b = b.acquire()
    assert held_a == [5000, 5001] and held_b == 5002
    with pytest.raises(RuntimeError, match="exhausted"):
        b.acquire()
    a.release(5000)
    assert b.acquire() == 5000  # released uids become free host-wide


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _start_as(uid: int, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, user=uid, group=uid, extra_groups=[],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def zombies() -> Iterator[list[subprocess.Popen]]:
    """Processes the test starts under a pool uid; killed and reaped at the end."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


async def _zombie_of(uid: int) -> subprocess.Popen:
    """A process of ``uid`` that exited and is not reaped (as a fork bomb's killed
    children are until init reaps them): it still counts against RLIMIT_NPROC."""
    proc = _start_as(uid, ["true"])
    await wait_until(lambda: _state(proc.pid) == "Z")
    return proc


@needs_root
@pytest.mark.parametrize("argv", [["true"], ["sleep", "600"]], ids=["zombie", "running"])
async def test_a_uid_with_a_process_left_is_not_handed_out_until_it_is_gone(
        tmp_path: Path, zombies: list[subprocess.Popen], argv: list[str]) -> None:
    proc = _start_as(POOL_UID, argv)
    zombies.append(proc)
    if argv == ["true"]:
        await wait_until(lambda: _state(proc.pid) == "Z")
    assert uids_with_processes(POOL_UID, 2) == {POOL_UID}
    pool = UidPool(POOL_UID, 2, str(tmp_path))
    assert pool.acquire() == POOL_UID + 1  # the lowest free uid is skipped
    with pytest.raises(RuntimeError, match=r"still has processes \(1 of 2\)"):
        pool.acquire()
    proc.kill()
    proc.wait()  # reaped: nothing of POOL_UID is left
    assert pool.acquire() == POOL_UID


@needs_root
async def test_a_call_after_a_fork_bomb_can_fork(readable_tmp: Path,
                                                  zombies: list[subprocess.Popen]) -> None:
    """Four killed, unreaped processes of the pool's first uid (a fork bomb's leftovers)
    and a limit of four processes: a call handed that uid failed its first fork with
    EAGAIN; it gets the next uid now."""
    sandbox = SubprocessSandbox(SandboxConfig(
        uid_base=SANDBOX_UID, num_uids=2, max_processes=4,
        work_root_dir=str(readable_tmp / "sandbox")))
    for _ in range(4):
        zombies.append(await _zombie_of(SANDBOX_UID))
    code = "import os, subprocess\nsubprocess.run(['true'], check=True)\nprint(os.getuid())"
    result = await sandbox.run(code, timeout_s=60)
    assert result.status is ToolStatus.SUCCESS, result.stderr
    assert result.stdout == f"{SANDBOX_UID + 1}\n"
