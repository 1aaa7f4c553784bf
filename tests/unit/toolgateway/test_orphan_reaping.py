"""A tool's orphans are reaped and their uid returns to the pool, whoever PID 1 is.

A process that left the tool call (double fork into its own session) and was killed with
the call's uid stays a zombie until the process that adopted it waits for it; until then
its uid is kept out of the pool (UidPool) and its pid is taken. Orphans go to the nearest
child subreaper, else to PID 1 of the PID namespace. The driver (orphan_driver.py) builds
the gateway's core as ``python -m services.toolgateway`` does and runs in a new PID
namespace (``unshare --pid --fork --mount-proc``), either as its PID 1 (a Kubernetes
container whose command is the gateway) or under a PID 1 that never reaps (a dev
container's ``sleep infinity``). Before, the zombie stayed in both and the second call
found the one-uid pool exhausted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
UNSHARE = shutil.which("unshare")
# A guard against a hang: the driver takes about 2 s on an idle machine.
GUARD_S = 180


@pytest.mark.skipif(os.geteuid() != 0 or UNSHARE is None,
                    reason="a new PID namespace and the uid drop need root and unshare "
                           "(util-linux)")
@pytest.mark.parametrize(("argv", "gateway_pid"), [([], 1), (["--under-init"], 2)],
                         ids=["gateway-is-pid-1", "under-an-init-that-never-reaps"])
def test_a_killed_escaped_process_is_reaped_and_its_uid_handed_out_again(
        argv: list[str], gateway_pid: int) -> None:
    done = subprocess.run(
        [UNSHARE, "--pid", "--fork", "--mount-proc", sys.executable, "-m",
         "tests.unit.toolgateway.orphan_driver", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["pid"] == gateway_pid  # the setting the case names
    assert report["first_error"] == "exit code 3"  # the tool's own status is not taken
    assert report["escaped_state"] == "gone", report
    assert (report["second_status"], report["lingering_uids"]) == ("SUCCESS", []), report
