"""A service whose Redis is unreachable says so: health NOT_SERVING while Redis is down,
SERVING once it is back on its port, with one log line per change (real processes, a
real redis-server killed and restarted)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from libra_cli.redis_server import free_ports, start_redis
from libra_cli.stack import health
from tests.service.test_graceful_shutdown import _start, _wait_serving


def _wait_health(address: str, want: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        seen = health(address, timeout_s=0.5)
        if seen == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{address}: health {seen}, wanted {want} within {timeout_s}s")


@pytest.mark.parametrize("module", ["services.coordinator", "services.scheduler"])
def test_health_is_not_serving_while_redis_is_down(module: str, tmp_path: Path) -> None:
    redis = start_redis(tmp_path / "redis")
    port, http_port = free_ports(2)
    extra = [f"--redis-url={redis.url}"]
    if module == "services.coordinator":
        extra += [f"--http-port={http_port}", f"--run-root={tmp_path}"]
    log = tmp_path / "service.log"
    proc = _start(module, port, extra, log)
    address = f"127.0.0.1:{port}"
    try:
        _wait_serving(address, proc, log)
        os.kill(redis.pid, signal.SIGKILL)
        redis.process.wait()
        _wait_health(address, "NOT_SERVING")
        redis = start_redis(tmp_path / "redis", port=redis.port)
        _wait_health(address, "SERVING")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        redis.stop()
    text = log.read_text()
    assert text.count("[health] dependency unreachable") == 1, text[-3000:]
    assert text.count("[health] dependency reachable again") == 1
