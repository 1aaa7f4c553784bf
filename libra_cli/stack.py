"""Start, find, check and stop the bare-metal stack (used by `libra up/down/status/run`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from libra.config import env_flag
from libra.errors import FailedPrecondition
from libra_cli.healthcheck import check
from libra_cli.launcher import DEFAULT_STACK, ROOT, read_state, state_path
from libra_cli.observe import ObserveOptions, phoenix_executable, status_row
from libra_cli.redis_server import pid_alive, terminate


def up(run_root: Path, stack: Path = DEFAULT_STACK, timeout_s: float = 90.0,
       observe: ObserveOptions | None = None) -> dict[str, Any]:
    """Start the supervisor detached and wait until every service reports SERVING (and,
    with ``observe``, the trace viewer answers).

    Whatever ends the wait early - a service dying at start-up, the timeout, or an
    exception raised by a signal handler (``libra run`` interrupted) - stops the
    supervisor this call started, by pid, before the exception goes on.

    Raises:
        FailedPrecondition: ``observe`` without a Phoenix virtualenv (naming the make
            target), or a stack already up without the viewer.
    """
    if observe is not None:
        phoenix_executable(observe.venv)  # before anything starts
    existing = read_state(run_root)
    if existing is not None:
        if observe is not None and not existing.get("observe"):
            raise FailedPrecondition("the stack is already up without --observe: "
                                     "`libra down` first, then `libra up --observe`")
        return existing
    (run_root / ".libra").mkdir(parents=True, exist_ok=True)
    log = open(run_root / ".libra" / "supervisor.log", "ab")  # noqa: SIM115
    extra = observe.launcher_args() if observe is not None else []
    supervisor = subprocess.Popen([sys.executable, "-m", "libra_cli.launcher", "--run-root",
                                   str(run_root), "--stack", str(stack), *extra], cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    log.close()
    try:
        return _wait_until_serving(run_root, timeout_s)
    except BaseException:
        _stop_supervisor(supervisor, run_root)
        raise


def _wait_until_serving(run_root: Path, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    dead_polls = 0
    while time.monotonic() < deadline:
        state = read_state(run_root)
        rows = status(state) if state is not None else []
        if rows and all(row["health"] == "SERVING" for row in rows):
            return state
        dead = [row for row in rows if row["health"] == "DEAD"]
        dead_polls = dead_polls + 1 if dead else 0
        if dead_polls >= 20:  # ~6 s dead: the supervisor gave up restarting it
            log = Path(dead[0]["log"])
            raise RuntimeError(f"service {dead[0]['name']} exited at start-up; see {log} "
                               f"and {log.with_suffix('.out')}")
        time.sleep(0.3)
    raise RuntimeError(f"stack not healthy within {timeout_s:.0f}s; see "
                       f"{run_root / '.libra' / 'logs'}")


def _stop_supervisor(supervisor: subprocess.Popen, run_root: Path,
                     timeout_s: float = 30.0) -> None:
    """SIGTERM the supervisor by pid (it stops its children by pid), SIGKILL after
    ``timeout_s``. Its handler is installed before it starts any child, so a SIGTERM
    that comes earlier leaves nothing behind."""
    terminate(supervisor, timeout_s)
    state_path(run_root).unlink(missing_ok=True)


def down(run_root: Path, timeout_s: float = 30.0) -> bool:
    """SIGTERM the supervisor by pid; it stops the services by pid. True if it was up."""
    state = read_state(run_root)
    if state is None:
        return False
    pid = int(state["supervisor_pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    state_path(run_root).unlink(missing_ok=True)
    return True


def health(address: str, timeout_s: float = 1.0) -> str:
    """The standard gRPC health status of a server ("" service = the whole server).

    Health needs no token; a stack started with TLS files in its environment
    (LIBRA_AUTH__TLS_CA_FILE) is checked over TLS with that CA.
    """
    return check(address, "", timeout_s, env_flag("LIBRA_AUTH__TLS_CA_FILE"),
                 env_flag("LIBRA_AUTH__TLS_CLIENT_CERT_FILE"),
                 env_flag("LIBRA_AUTH__TLS_CLIENT_KEY_FILE"))


def status(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Each service: name, pid, address, metrics port, health, restarts, log file; the
    trace viewer last when ``--observe`` started one (with its ``url``)."""
    out = []
    for svc in state["services"]:
        alive = pid_alive(int(svc["pid"]))
        out.append({"name": svc["name"], "pid": svc["pid"],
                    "address": f"127.0.0.1:{svc['port']}", "metrics_port": svc["metrics_port"],
                    "health": health(f"127.0.0.1:{svc['port']}") if alive else "DEAD",
                    "restarts": svc["restarts"], "log": svc["log_path"]})
    if state.get("observe"):
        out.append(status_row(state["observe"]))
    return out


def coordinator_address(state: dict[str, Any]) -> str:
    svc = next(s for s in state["services"] if s["name"] == "coordinator")
    return f"127.0.0.1:{svc['port']}"


def coordinator_client(state: dict[str, Any], timeout_s: float = 10.0) -> Any:
    """A coordinator client for the stack of ``state``, with the stack's api token."""
    from libra.clients.coordinator import GrpcCoordinatorClient
    from libra_cli.credentials import stack_auth

    return GrpcCoordinatorClient(coordinator_address(state), timeout_s,
                                 auth=stack_auth(Path(state["run_root"])))
