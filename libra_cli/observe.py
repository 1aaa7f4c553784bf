"""``libra up --observe``: a local trace viewer (Arize Phoenix) beside the bare-metal stack.

Phoenix runs from its own virtualenv (``make observe-venv``: scripts/setup_phoenix_venv.sh;
about 850 MB, kept out of the runtime's requirements), offline, on loopback. The
supervisor starts it before the services, points every service's OTLP exporter at its
gRPC receiver (``LIBRA_TELEMETRY__OTLP_ENDPOINT``), lists it in the stack state (``libra
status`` shows it, ``libra logs phoenix`` reads its log) and stops it by pid with the
rest. Its database lives under ``<run_root>/.libra/phoenix``, so traces outlive a
``libra down`` and the next ``--observe`` shows them again.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libra.config import env_flag
from libra.errors import FailedPrecondition
from libra_cli.redis_server import free_ports, pid_alive

PHOENIX_VENV_ENV = "LIBRA_PHOENIX_VENV"
"""Where the Phoenix virtualenv is when not ``<repository>/.venv-phoenix``."""
MAKE_TARGET = "make observe-venv"


def default_venv(root: Path) -> Path:
    """``$LIBRA_PHOENIX_VENV``, else ``<root>/.venv-phoenix`` (what the make target builds)."""
    configured = env_flag(PHOENIX_VENV_ENV)
    return Path(configured).expanduser() if configured else root / ".venv-phoenix"


def phoenix_executable(venv: Path) -> Path:
    """The ``phoenix`` command of ``venv``.

    Raises:
        FailedPrecondition: the venv has none, naming the make target that builds it.
    """
    exe = venv / "bin" / "phoenix"
    if not os.access(exe, os.X_OK):
        raise FailedPrecondition(
            f"--observe needs Arize Phoenix in {venv} ({exe} not found): run "
            f"`{MAKE_TARGET}`, or point --phoenix-venv / ${PHOENIX_VENV_ENV} at a virtualenv "
            "with arize-phoenix installed")
    return exe


@dataclass(frozen=True, slots=True)
class ObserveOptions:
    """What ``libra up --observe`` asked for (ports 0: free ones)."""

    venv: Path
    port: int = 0
    grpc_port: int = 0

    def launcher_args(self) -> list[str]:
        return [f"--phoenix-venv={self.venv}", f"--phoenix-port={self.port}",
                f"--phoenix-grpc-port={self.grpc_port}"]


@dataclass(frozen=True, slots=True)
class Viewer:
    """A started Phoenix: where its UI and OTLP receiver listen, its files."""

    pid: int
    port: int
    """HTTP: the UI, the REST API (/v1/...) and OTLP over HTTP (/v1/traces)."""
    grpc_port: int
    """OTLP over gRPC: what the services export to."""
    working_dir: str
    log_path: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def otlp_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def to_state(self) -> dict[str, Any]:
        return {**asdict(self), "url": self.url, "otlp_endpoint": self.otlp_endpoint}


def start_phoenix(venv: Path, run_root: Path, log_path: Path, port: int = 0,
                  grpc_port: int = 0) -> tuple[subprocess.Popen, Viewer]:
    """Spawn ``phoenix serve`` on loopback (0: a free port), working dir under the run
    root, product telemetry off (it runs offline)."""
    exe = phoenix_executable(venv)
    free = iter(free_ports(2))
    port = port or next(free)
    grpc_port = grpc_port or next(free)
    working_dir = run_root / ".libra" / "phoenix"
    working_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_WORKING_DIR": str(working_dir),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([str(exe), "serve"], stdout=log, stderr=subprocess.STDOUT,
                            env=env, cwd=working_dir)
    log.close()
    return proc, Viewer(proc.pid, port, grpc_port, str(working_dir), str(log_path))


def viewer_health(state: dict[str, Any], timeout_s: float = 1.0) -> str:
    """SERVING once Phoenix answers /healthz, NOT_SERVING while it starts, DEAD when
    its process is gone."""
    if not pid_alive(int(state["pid"])):
        return "DEAD"
    try:
        with urllib.request.urlopen(f"{state['url']}/healthz", timeout=timeout_s) as reply:
            return "SERVING" if reply.status == 200 else "NOT_SERVING"
    except (urllib.error.URLError, OSError):
        return "NOT_SERVING"


def status_row(state: dict[str, Any]) -> dict[str, Any]:
    """The viewer's row in ``libra status`` (the keys of a service's row, and its URL)."""
    return {"name": "phoenix", "pid": state["pid"], "address": state["otlp_endpoint"],
            "metrics_port": -1, "health": viewer_health(state), "restarts": 0,
            "log": state["log_path"], "url": state["url"]}


