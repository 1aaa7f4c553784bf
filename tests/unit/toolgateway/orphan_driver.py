"""The tool gateway's core, built as ``python -m services.toolgateway`` builds it, run
by test_orphan_reaping.py as PID 1 of a new PID namespace (no argument), or as the only
child of a PID 1 that waits for it alone and reaps nothing else (``--under-init``: a dev
container's ``sleep infinity``, a supervisor that waits for its own children only), or
as the child of the image's init (tini) when the test puts it first.

One python call leaves an escaped process (double fork into its own session) and exits 3.
Under the uid drop the sandbox kills that process with the call's uid at the exit;
without it nothing can find it, so it ends by itself. Either way it becomes a zombie of
whoever adopted it. Then a second call needs the uid again (the pool has one). The last
stdout line is a JSON report: the first call's error (its exit status must survive the
reaping), the escaped process's state after the second call ("gone" once reaped, "Z"
while not), the second call's status and error, and the uids with processes left.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

from libra.config import load_config
from services.toolgateway.__main__ import build_core
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ToolCall
from services.toolgateway.isolation import uids_with_processes
from services.toolgateway.orphans import adopt_orphans

UID_BASE = 993_000  # apart from the other tests' uids
GUARD_S = 60.0  # against a hang only: dying takes milliseconds
ESCAPES_THEN_EXITS_3 = (
    "import os, sys\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.closerange(0, 3)\n"  # holds none of the call's pipes
    "        os.execv('/bin/sleep', ['sleep', '{sleep_s}'])\n"
    "    print(pid, flush=True)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "sys.exit(3)\n")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


async def _calls() -> dict[str, object]:
    cfg = load_config(ToolGatewayConfig, "toolgateway", argv=[
        "--sandbox-uid-base", str(UID_BASE), "--sandbox-num-uids", "1",
        "--python-timeout-s", "60"], environ={})
    core = build_core(cfg)
    adopt_orphans()  # as the gateway's run() does before it serves
    sleep_s = 600 if os.geteuid() == 0 else 0.1  # killed with its uid, or ends itself
    first = await core.execute(ToolCall("orphans", "1", "python", {
        "code": ESCAPES_THEN_EXITS_3.format(sleep_s=sleep_s)}))
    escaped_pid = int(first.output.split()[0])
    deadline_s = time.monotonic() + GUARD_S
    while _state(escaped_pid) not in ("Z", "gone") and time.monotonic() < deadline_s:
        await asyncio.sleep(0.01)
    second = await core.execute(ToolCall("orphans", "2", "python", {"code": "print(2)"}))
    return {"pid": os.getpid(), "uid": os.geteuid(), "first_error": first.error,
            "escaped_state": _state(escaped_pid), "second_status": second.status.name,
            "second_error": second.error,
            "lingering_uids": sorted(uids_with_processes(UID_BASE, 1))}


def main() -> int:
    if sys.argv[1:] == ["--under-init"]:  # PID 1 waits for this child alone
        return subprocess.run([sys.executable, "-m", __spec__.name], check=False).returncode
    print(json.dumps(asyncio.run(_calls())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
