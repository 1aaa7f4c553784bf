"""Bare-metal launcher: starts Redis and the five services as processes and supervises
them by pid (never by name). ``libra up`` runs this module detached; ``libra down``
sends it SIGTERM, and it stops every child by pid (SIGTERM, grace, SIGKILL).

State for other commands (pids, addresses, metrics ports, log files) is written to
``<run_root>/.libra/state.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from libra.config import env_flag
from libra.data_roots import DEFAULT_DATA_ROOTS
from libra_cli.observe import ObserveOptions, Viewer, start_phoenix
from libra_cli.redis_server import EmbeddedRedis, free_ports, pid_alive, start_redis, terminate
from libra_cli.stack_secrets import StackSecrets, ensure_stack_secrets

logger = logging.getLogger("libra_cli.launcher")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STACK = ROOT / "deploy" / "baremetal" / "stack.toml"


@dataclass
class ServiceProc:
    """One supervised service process."""

    name: str
    module: str
    args: list[str]
    port: int
    metrics_port: int
    log_path: str
    """The service's log (written by its logging, rotated by size)."""
    pid: int = 0
    restarts: int = 0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started_at_s: float = field(default=0.0, repr=False)
    """When this process was spawned (the supervisor's monotonic clock)."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def out_path(self) -> str:
        """What the process writes outside its logging (a crash before logging starts,
        libraries printing); beside ``log_path``, never rotated (it stays small)."""
        return str(Path(self.log_path).with_suffix(".out"))


def state_path(run_root: Path) -> Path:
    return run_root / ".libra" / "state.json"


def read_state(run_root: Path) -> dict[str, Any] | None:
    path = state_path(run_root)
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    return state if pid_alive(int(state.get("supervisor_pid", 0))) else None


CORE_SERVICES = ("coordinator", "scheduler", "trainer", "toolgateway")


def service_names(stack: dict[str, Any]) -> list[str]:
    """The processes `libra up` starts for ``stack``: the four services, then one per
    ``[[rollout]]`` instance (its instance id); each logs to ``logs_dir()/<name>.log``."""
    return [*CORE_SERVICES, *(inst["instance_id"] for inst in stack.get("rollout", []))]


def logs_dir(run_root: Path) -> Path:
    """Where the services' logs (``<name>.log``, rotated ``.log.1``..; ``<name>.out``)
    and the supervisor's (``supervisor.log``, one level up) are written."""
    return run_root / ".libra" / "logs"


def _plan(stack: dict[str, Any], run_root: Path) -> list[ServiceProc]:
    names = list(CORE_SERVICES)
    rollouts = stack.get("rollout", [])
    # Every port in one go (4 service + rollout + REST + a metrics port each).
    pool = iter(free_ports(2 * (len(names) + len(rollouts)) + 1))
    ports = {name: next(pool) for name in names}
    peers = [f"--peers.{name}=127.0.0.1:{ports[name]}" for name in names]
    # The Redis URL (it holds the password) and the tokens reach the services through
    # their environment (see Supervisor._spawn), never the command line, which any local
    # user can read.
    common = peers
    logs = logs_dir(run_root)
    # One list for both: the coordinator checks a job's files against the roots at
    # submit, the gateway again before it reads one. Relative roots: to the repository.
    roots = ",".join(str((ROOT / root).resolve())
                     for root in stack.get("data_roots", DEFAULT_DATA_ROOTS))
    specs: list[tuple[str, str, int, list[str]]] = [
        ("coordinator", "services.coordinator", ports["coordinator"],
         [f"--run-root={run_root}", f"--http-port={next(pool)}",
          f"--tool-data-roots={roots}"]),
        ("scheduler", "services.scheduler", ports["scheduler"], []),
        ("trainer", "services.trainer", ports["trainer"], ["--worker-id=trainer-0"]),
        ("toolgateway", "services.toolgateway", ports["toolgateway"],
         [f"--data-roots={roots}"]),
    ]
    for inst in rollouts:
        specs.append((inst["instance_id"], "services.rollout", next(pool), [
            f"--instance-id={inst['instance_id']}", f"--bucket={inst['bucket']}",
            f"--max-batch-size={inst.get('max_batch_size', 8)}",
            f"--max-trajectories={inst.get('max_trajectories', 16)}",
            f"--role={inst.get('role', 'core-rollout')}"]))
    out = []
    for name, module, port, extra in specs:
        metrics = next(pool)
        log_path = str(logs / f"{name}.log")
        args = [f"--server.port={port}", f"--server.metrics-port={metrics}",
                f"--telemetry.log-file={log_path}",
                f"--server.shutdown-grace-s={stack.get('shutdown_grace_s', 10.0)}"]
        if module != "services.toolgateway":
            args += common
        else:
            args += [f"--peers.coordinator=127.0.0.1:{ports['coordinator']}"]
        out.append(ServiceProc(name, module, args + extra, port, metrics, log_path))
    return out


class Supervisor:
    """Starts the stack, restarts crashed services, stops everything by pid."""

    def __init__(self, run_root: Path, stack_file: Path,
                 clock: Callable[[], float] = time.monotonic,
                 observe: ObserveOptions | None = None) -> None:
        self.run_root = run_root.resolve()
        self.observe = observe
        self.viewer: Viewer | None = None
        self._viewer_proc: subprocess.Popen | None = None
        self.stack = tomllib.loads(stack_file.read_text())
        self.redis: EmbeddedRedis | None = None
        self.redis_url = env_flag("REDIS_URL")
        self.redis_restarts = 0
        self.services: list[ServiceProc] = []
        self.secrets: StackSecrets | None = None
        self._stopping = False
        self._clock = clock
        self._restart_limit = int(self.stack.get("restart_limit", 3))
        self._stable_s = float(self.stack.get("restart_reset_s", 300.0))

    def start(self) -> None:
        logs_dir(self.run_root).mkdir(parents=True, exist_ok=True)
        self.secrets = ensure_stack_secrets(self.run_root)
        if not self.redis_url:
            self.redis = start_redis(self.run_root / ".libra" / "redis",
                                     password=self.secrets.read("redis_password"))
            self.redis_url = self.redis.url
        if self.observe is not None:
            # Before the services: their exporters point at it from their first span.
            self._viewer_proc, self.viewer = start_phoenix(
                self.observe.venv, self.run_root, logs_dir(self.run_root) / "phoenix.log",
                self.observe.port, self.observe.grpc_port)
            logger.info("[start] phoenix pid=%d url=%s otlp=%s", self.viewer.pid,
                        self.viewer.url, self.viewer.otlp_endpoint)
        self.services = _plan(self.stack, self.run_root)
        for svc in self.services:
            self._spawn(svc)
        self._write_state()

    def _spawn(self, svc: ServiceProc) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
               # Secrets by environment and file path (docs/operations.md, "Security").
               "LIBRA_REDIS_URL": self.redis_url,
               "LIBRA_AUTH__API_TOKEN_FILE": str(self.secrets.api_token_file),
               "LIBRA_AUTH__SERVICE_TOKEN_FILE": str(self.secrets.service_token_file)}
        if self.viewer is not None:  # every service, or traces break at the one left out
            env["LIBRA_TELEMETRY__OTLP_ENDPOINT"] = self.viewer.otlp_endpoint
            # A viewer on one machine shows every gRPC call and Redis command too (the
            # services' default records those only under a sampled caller); a sampler
            # the user set wins.
            env.setdefault("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        log = open(svc.out_path, "ab")  # noqa: SIM115 - the child owns it
        svc.proc = subprocess.Popen([sys.executable, "-m", svc.module, *svc.args], cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        svc.pid = svc.proc.pid
        svc.started_at_s = self._clock()
        logger.info("[start] service=%s pid=%d address=%s", svc.name, svc.pid, svc.address)

    def _write_state(self) -> None:
        state = {"supervisor_pid": os.getpid(), "run_root": str(self.run_root),
                 "redis_url": self.redis_url,
                 "redis_pid": self.redis.pid if self.redis else None,
                 "redis_restarts": self.redis_restarts,
                 "observe": self.viewer.to_state() if self.viewer else None,
                 "services": [{f.name: getattr(s, f.name) for f in fields(ServiceProc)
                               if f.name not in ("proc", "started_at_s")}
                              for s in self.services]}
        path = state_path(self.run_root)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        # 0600: the state holds the Redis URL with its password.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(state, indent=2))
        tmp.replace(path)

    def supervise(self) -> None:
        """Restart what exits while the stack is up, until stopped."""
        while not self._stopping:
            self.supervise_once()
            time.sleep(0.5)

    def supervise_once(self) -> None:
        """One pass: Redis first (every service needs it), then each service."""
        changed = self._check_redis()
        for svc in self.services:
            if self._stopping:
                return
            changed |= self._check_service(svc)
        if changed:
            self._write_state()

    def _check_service(self, svc: ServiceProc) -> bool:
        """Restart ``svc`` if it exited (bounded by ``restart_limit``); a service that
        stayed up ``restart_reset_s`` gets its budget back, so rare crashes over a long
        run never exhaust it. Returns whether the state changed."""
        code = svc.proc.poll() if svc.proc else None
        if code is None:
            if svc.restarts and self._clock() - svc.started_at_s >= self._stable_s:
                logger.info("[restart] service=%s stable for %.0fs: restart budget reset",
                            svc.name, self._stable_s)
                svc.restarts = 0
                return True
            return False
        if svc.restarts >= self._restart_limit:
            return False
        svc.restarts += 1
        logger.warning("[restart] service=%s exit=%s restart=%d", svc.name, code,
                       svc.restarts)
        self._spawn(svc)
        return True

    def _check_redis(self) -> bool:
        """Restart the embedded Redis on its port from its AOF when it died (the services'
        clients reconnect to the same URL). A failed start is retried on the next pass."""
        if self.redis is None or self.redis.process.poll() is None:
            return False
        logger.warning("[restart] redis exit=%s port=%d: restarting from its AOF",
                       self.redis.process.returncode, self.redis.port)
        try:
            self.redis = start_redis(self.redis.data_dir, port=self.redis.port,
                                     password=self.redis.password)
        except RuntimeError as exc:
            logger.error("[restart] redis did not come back (retrying): %s", exc)
            return False
        self.redis_restarts += 1
        return True

    def stop(self, *_args: Any) -> None:
        """SIGTERM every child by pid, wait out the grace period, SIGKILL the rest."""
        if self._stopping:
            return
        self._stopping = True
        grace_s = float(self.stack.get("shutdown_grace_s", 10.0))
        live = [s.proc for s in self.services if s.proc and s.proc.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s + 2.0
        for proc in live:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._viewer_proc is not None:
            terminate(self._viewer_proc, grace_s)
        if self.redis is not None:
            self.redis.stop()
        state_path(self.run_root).unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-root", type=Path, default=Path("runs"))
    parser.add_argument("--stack", type=Path, default=DEFAULT_STACK)
    parser.add_argument("--phoenix-venv", type=Path, default=None,
                        help="also run Phoenix from this virtualenv (libra up --observe)")
    parser.add_argument("--phoenix-port", type=int, default=0)
    parser.add_argument("--phoenix-grpc-port", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    observe = (None if args.phoenix_venv is None else
               ObserveOptions(args.phoenix_venv, args.phoenix_port, args.phoenix_grpc_port))
    sup = Supervisor(args.run_root, args.stack, observe=observe)
    signal.signal(signal.SIGTERM, lambda *_: setattr(sup, "_stopping", True))
    signal.signal(signal.SIGINT, lambda *_: setattr(sup, "_stopping", True))
    sup.start()
    try:
        sup.supervise()
    finally:
        sup._stopping = False
        sup.stop()


if __name__ == "__main__":
    main()
