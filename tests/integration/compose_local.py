"""Run deploy/compose/compose.yaml's services as local processes (no Docker engine here).

Each compose service becomes a process started from its own definition: its ``command``,
its ``environment`` (interpolated as compose does: ``${VAR}``, ``${VAR:-default}``,
``${VAR:?message}``) on top of the image's ``ENV`` (deploy/Dockerfile's runtime stage),
in ``depends_on`` order, each waiting until its dependencies' ``healthcheck`` commands
pass (services in a profile are not started, as without ``--profile``). What a container
network would provide is translated, and only that:

- **names**: a compose service name used as a host (``redis:6379``, ``scheduler:50052``,
  ``LIBRA_ROLLOUT_ADVERTISE_HOST: rollout-0``) becomes 127.0.0.1, and loopback in a
  service's own health check is that service;
- **ports**: every (service, container port) gets its own free local port, applied to the
  service's own ``*_PORT`` settings, to every ``service:port`` reference to it and to its
  health check. One host cannot give each service its own 9100, and fixed ports could
  collide with other test runs on this machine; ``redis-cli`` in a health check gets
  ``-p`` for the port it would otherwise assume (6379);
- **volumes**: a named volume is a folder under the run root, and a value naming its mount
  point inside the container (``/app/runs``) names that folder;
- **image**: ``python`` is this interpreter, ``redis-server``/``redis-cli`` the project's
  binaries (``find_redis_server``); the working directory is the repository (the image's
  ``/app``), and Redis gets ``--dir`` (its volume) and ``--bind 127.0.0.1``.

Processes are stopped by pid (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from libra_cli.redis_server import find_redis_server, free_ports

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose" / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$\$")


def interpolate(text: str, environ: dict[str, str]) -> str:
    """Compose variable interpolation (the forms compose.yaml uses)."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3)
        value = environ.get(name)
        if op in (":?", "?") and not value:
            raise ValueError(f"{name}: {arg}")
        if op in (":-", "-") and not value:
            return arg
        return value or ""
    return _VAR.sub(one, text)


def image_env() -> dict[str, str]:
    """The ``ENV`` settings of the Dockerfile's runtime stage, minus the container paths."""
    text = DOCKERFILE.read_text().split(" AS runtime", 1)[1].replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in line[4:].split():
                key, _, value = pair.partition("=")
                env[key] = value
    for container_only in ("PATH", "PYTHONPATH", "HOME"):
        env.pop(container_only, None)
    return env


@dataclass
class LocalCompose:
    """The compose project as processes under ``root``."""

    root: Path
    environ: dict[str, str]
    doc: dict[str, Any] = field(default_factory=lambda: yaml.safe_load(COMPOSE_FILE.read_text()))
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def services(self) -> dict[str, Any]:
        """What a plain ``docker compose up`` starts: services in a profile (``observe``:
        Prometheus, Grafana, the collector, Jaeger; images, not Libra code) are left out,
        as compose leaves them out without ``--profile``."""
        return {name: svc for name, svc in self.doc["services"].items()
                if not svc.get("profiles")}

    def __post_init__(self) -> None:
        wanted = sorted({(name, port) for name, svc in self.services.items()
                         for port in self._container_ports(name, svc)})
        self.ports = dict(zip(wanted, free_ports(len(wanted)), strict=True))

    def _container_ports(self, name: str, svc: dict[str, Any]) -> set[int]:
        """Ports the service listens on: its published container ports and ``*_PORT``s."""
        ports = {int(str(p).rsplit(":", 1)[-1]) for p in svc.get("ports", [])}
        ports |= {int(v) for k, v in self._raw_env(svc).items()
                  if k.endswith("_PORT") and str(v).isdigit()}
        if name == "redis":
            ports.add(6379)
        return ports

    def _raw_env(self, svc: dict[str, Any]) -> dict[str, str]:
        return {k: interpolate(str(v), self.environ) for k, v in svc.get("environment",
                                                                        {}).items()}

    def local(self, service: str, port: int) -> int:
        return self.ports[(service, port)]

    def _translate(self, name: str, key: str, value: str) -> str:
        """What the container network would make of one value."""
        def address(match: re.Match[str]) -> str:
            # Inside a container, loopback is the service itself.
            host = name if match[1] in ("127.0.0.1", "localhost") else match[1]
            port = int(match[2])
            return (f"127.0.0.1:{self.local(host, port)}" if (host, port) in self.ports
                    else match[0])

        value = re.sub(r"(?<![\w.-])([\w.-]+):(\d+)\b", address, value)
        if key.endswith("_HOST") and value in self.services:
            return "127.0.0.1"
        if key.endswith("_PORT") and value.isdigit() and (name, int(value)) in self.ports:
            return str(self.local(name, int(value)))
        for source, target in self._mounts(name).items():
            value = value.replace(target, str(self.root / "volumes" / source))
        return value

    def _mounts(self, name: str) -> dict[str, str]:
        """Named volume -> its mount point in the container."""
        out = {}
        for volume in self.services[name].get("volumes", []):
            source, target = str(volume).split(":")[:2]
            out[source] = target
        return out

    def env(self, name: str) -> dict[str, str]:
        own = {k: self._translate(name, k, v) for k, v in self._raw_env(self.services[name])
               .items()}
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("LIBRA_")}
        return {**inherited, **image_env(), "PYTHONPATH": str(ROOT), **own}

    def argv(self, name: str, command: list[str]) -> list[str]:
        out = [self._translate(name, "", interpolate(str(a), self.environ)) for a in command]
        if out[0] == "python":
            out[0] = sys.executable
        elif out[0] == "redis-server":
            volume = next(s for s, target in self._mounts(name).items() if target == "/data")
            data = self.root / "volumes" / volume
            data.mkdir(parents=True, exist_ok=True)
            out = [find_redis_server(), *out[1:], "--port", str(self.local(name, 6379)),
                   "--bind", "127.0.0.1", "--dir", str(data)]
        elif out[0] == "redis-cli":
            out = [str(Path(find_redis_server()).with_name("redis-cli")),
                   "-p", str(self.local(name, 6379)), *out[1:]]
        return out

    def start(self, timeout_s: float = 240.0) -> None:
        """Every service in dependency order, each once its dependencies are healthy."""
        started: set[str] = set()
        while len(started) < len(self.services):
            ready = [n for n, svc in self.services.items() if n not in started
                     and set(svc.get("depends_on", {})) <= started]
            for name in ready:
                for dep in self.services[name].get("depends_on", {}):
                    self.wait_healthy(dep, timeout_s)
                self._spawn(name)
                started.add(name)
        for name in self.services:
            self.wait_healthy(name, timeout_s)

    def _spawn(self, name: str) -> None:
        svc = self.services[name]
        log = (self.root / "logs" / f"{name}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        for source in self._mounts(name):
            (self.root / "volumes" / source).mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.procs[name] = subprocess.Popen(
                self.argv(name, list(svc["command"])), cwd=ROOT, env=self.env(name),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def healthy(self, name: str) -> bool:
        test = self.services[name]["healthcheck"]["test"]
        assert test[0] == "CMD", f"{name}: only CMD health checks are run here"
        argv = self.argv(name, test[1:])
        done = subprocess.run(argv, cwd=ROOT, env=self.env(name), capture_output=True,
                              timeout=30)
        if argv[0].endswith("redis-cli"):  # it exits 0 on an error reply too
            return done.stdout.strip() == b"PONG"
        return done.returncode == 0

    def wait_healthy(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy(name):
            proc = self.procs[name]
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} not healthy (exit {proc.poll()}): "
                                     f"{self.log(name)[-3000:]}")
            time.sleep(0.5)

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
