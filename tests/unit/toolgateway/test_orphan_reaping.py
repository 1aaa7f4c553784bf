"""A tool's orphans are reaped and their uid returns to the pool, whoever PID 1 is.

A process that left the tool call (double fork into its own session) and was killed with
the call's uid stays a zombie until the process that adopted it waits for it; until then
its uid is kept out of the pool (UidPool) and its pid is taken. Orphans go to the nearest
child subreaper, else to PID 1 of the PID namespace. The driver (orphan_driver.py) builds
the gateway's core as ``python -m services.toolgateway`` does and runs in a new PID
namespace (``unshare --pid --fork --mount-proc``): as its PID 1 (a Kubernetes container
whose command is the gateway), under a PID 1 that never reaps (a dev container's ``sleep
infinity``), and under the image's ENTRYPOINT (tini) as in compose and Kubernetes. Before,
the zombie stayed in the first two and the second call found the one-uid pool exhausted.
The reaper's choice of zombies is pinned too: it must never take an exit status that
someone waits for.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.toolgateway.config import ToolGatewayConfig
from tests.unit.deploy.test_compose_schema import DOCKERFILE, image_entrypoint

ROOT = Path(__file__).resolve().parents[3]
# The image's init, as `docker run` and the manifests start the gateway under it.
INIT = image_entrypoint(DOCKERFILE.read_text()) or []
# A process's state letter from /proc (Z: a zombie), for the scripts below.
STATE = """
def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"
"""
# Run in a fresh interpreter: it becomes a child subreaper, as the gateway does, and
# pytest's own children (other tests' servers) are not this test's to take.
WHICH_ZOMBIES = STATE + """
import os, time
from services.toolgateway.orphans import OrphanReaper, adopt_orphans

def spawn(code, new_session):
    return os.posix_spawn("/bin/sh", ["sh", "-c", f"exit {code}"], {}, setsid=new_session)

assert adopt_orphans()
reaper = OrphanReaper()
own = spawn(4, new_session=False)   # the gateway's own fork: in its session, own waiter
with reaper.spawning() as spared:
    tool = spawn(7, new_session=True)  # the tool process asyncio waits for
    spared.add(tool)
left = spawn(5, new_session=True)   # a tool's leftover: outside the session, no waiter
deadline_s = time.monotonic() + 60
while {state(p) for p in (own, tool, left)} != {"Z"} and time.monotonic() < deadline_s:
    time.sleep(0.01)
with reaper.spawning():
    assert reaper.reap() == 0 and state(left) == "Z"  # a spawn in progress: skip
assert reaper.reap() == 1 and state(left) == "gone"
assert os.waitstatus_to_exitcode(os.waitpid(tool, 0)[1]) == 7
assert os.waitstatus_to_exitcode(os.waitpid(own, 0)[1]) == 4
"""
UNSHARE = shutil.which("unshare")
# A guard against a hang: the driver takes about 2 s on an idle machine.
GUARD_S = 180


@pytest.mark.skipif(os.geteuid() != 0 or UNSHARE is None,
                    reason="a new PID namespace and the uid drop need root and unshare "
                           "(util-linux)")
@pytest.mark.parametrize(("init", "argv", "gateway_pid"), [
    ([], [], 1), ([], ["--under-init"], 2), (INIT, [], 2)],
    ids=["gateway-is-pid-1", "under-an-init-that-never-reaps", "under-the-images-init"])
def test_a_killed_escaped_process_is_reaped_and_its_uid_handed_out_again(
        init: list[str], argv: list[str], gateway_pid: int) -> None:
    if init and shutil.which(init[0]) is None:
        pytest.skip(f"{init[0]} missing: scripts/setup_system.sh installs it (Debian)")
    done = subprocess.run(
        [UNSHARE, "--pid", "--fork", "--mount-proc", *init, sys.executable, "-m",
         "tests.unit.toolgateway.orphan_driver", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["pid"] == gateway_pid  # the setting the case names
    assert report["first_error"] == "exit code 3"  # the tool's own status is not taken
    assert report["escaped_state"] == "gone", report
    assert (report["second_status"], report["lingering_uids"]) == ("SUCCESS", []), report


def test_the_reaper_takes_leftovers_only_never_a_status_someone_waits_for() -> None:
    """Zombie children outside the process's session are a tool's leftovers; a child in
    its session (the file reader's fork, the kill helper) and the tool process itself
    keep their exit status for their own waiter, and no reap runs during a spawn."""
    done = subprocess.run([sys.executable, "-c", WHICH_ZOMBIES], cwd=ROOT,
                          capture_output=True, text=True, timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr


# The gateway's main, serving with no call at all: a tool's leftover that exits between
# calls (here: after the test closes the pipe it blocks on) is reaped by the server's
# periodic reap, not left a zombie until a next call that may never come.
REAPED_BETWEEN_CALLS = STATE + """
import asyncio, os, signal, subprocess, sys
from libra.config import load_config
from services.toolgateway.__main__ import main
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.orphans import adopt_orphans
from tests.waiting import wait_until

DOUBLE_FORKS = '''
import os, sys
if os.fork() == 0:
    os.setsid()
    os.closerange(0, 3)
    os.read(int(sys.argv[1]), 1)  # until the test closes the write end
    os._exit(0)
'''

def leave_orphan(read_fd):
    subprocess.run([sys.executable, "-c", DOUBLE_FORKS, str(read_fd)], pass_fds=(read_fd,),
                   check=True)

def adopted(own_session):
    # This process's children outside its session: the orphans it adopted.
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and int(fields[3]) != own_session:
                found.append(int(name))
    return found

async def scenario():
    cfg = load_config(ToolGatewayConfig, "toolgateway", argv=[
        "--server.port=0", "--server.metrics-port=-1", "--orphan-reap-interval-s=0.05"],
        environ={})
    assert adopt_orphans()
    serving = asyncio.create_task(main(cfg))
    read_fd, write_fd = os.pipe()
    leave_orphan(read_fd)
    os.close(read_fd)
    (orphan,) = adopted(os.getsid(0))
    assert state(orphan) != "Z"  # alive until the pipe closes
    os.close(write_fd)
    await wait_until(lambda: state(orphan) == "gone")
    os.kill(os.getpid(), signal.SIGTERM)  # the server stops, and its reaping with it
    await serving

asyncio.run(scenario())
"""


def test_a_leftover_that_exits_between_calls_is_reaped_without_another_call() -> None:
    done = subprocess.run([sys.executable, "-c", REAPED_BETWEEN_CALLS], cwd=ROOT,
                          capture_output=True, text=True, timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("interval_s", [0.0, -1.0, float("nan"), float("inf")])
def test_a_reap_interval_that_is_not_a_positive_number_is_refused_naming_it(
        interval_s: float) -> None:
    with pytest.raises(ValueError, match="orphan_reap_interval_s"):
        ToolGatewayConfig(orphan_reap_interval_s=interval_s)
