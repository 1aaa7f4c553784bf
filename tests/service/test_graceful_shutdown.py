"""Every service process stops on SIGTERM: health flips, work drains, exit status 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libra_cli.redis_server import EmbeddedRedis, free_ports
from libra_cli.stack import health

ROOT = Path(__file__).resolve().parents[2]


def _start(module: str, port: int, extra: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", module, f"--server.port={port}",
                                 "--server.metrics-port=-1", "--server.shutdown-grace-s=3",
                                 *extra], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=env)


def _wait_serving(address: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        if health(address, timeout_s=0.5) == "SERVING":
            return
        time.sleep(0.2)
    raise AssertionError(f"{address} never served: {log.read_text()[-2000:]}")


@pytest.mark.parametrize("module", ["services.coordinator", "services.scheduler",
                                    "services.trainer", "services.toolgateway"])
def test_sigterm_drains_and_exits_zero(module: str, redis_server: EmbeddedRedis,
                                       tmp_path: Path) -> None:
    port, http_port = free_ports(2)
    extra = [f"--redis-url={redis_server.url}"] if module != "services.toolgateway" else []
    if module == "services.coordinator":
        extra += [f"--http-port={http_port}", f"--run-root={tmp_path}"]
    log = tmp_path / "service.log"
    proc = _start(module, port, extra, log)
    try:
        _wait_serving(f"127.0.0.1:{port}", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "[shutdown] stopped" in log.read_text()
