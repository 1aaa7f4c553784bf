"""The launcher's supervision with real processes: a crashed service is restarted up to
the stack's limit; a service that stays up long enough gets its budget back; a killed
Redis comes back on its port with its data (AOF). The clock is injected, so no test
waits for the stable period."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync

from libra_cli.launcher import ServiceProc, Supervisor
from libra_cli.redis_server import start_redis
from libra_cli.stack_secrets import ensure_stack_secrets

STABLE_S = 300.0


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[tuple[Supervisor, Clock]]:
    stack = tmp_path / "stack.toml"
    stack.write_text(f"restart_limit = 1\nrestart_reset_s = {STABLE_S}\n")
    clock = Clock()
    sup = Supervisor(tmp_path / "runs", stack, clock=clock)
    (sup.run_root / ".libra" / "logs").mkdir(parents=True)
    sup.secrets = ensure_stack_secrets(sup.run_root)  # what start() makes first
    yield sup, clock
    sup.stop()


def _service(sup: Supervisor, name: str, *args: str) -> ServiceProc:
    log = str(sup.run_root / ".libra" / "logs" / f"{name}.log")
    svc = ServiceProc(name, "tests.fakes.service_proc", list(args), 0, -1, log)
    sup.services.append(svc)
    sup._spawn(svc)
    return svc


def test_a_crashing_service_is_restarted_up_to_the_limit(supervisor) -> None:
    sup, _ = supervisor
    svc = _service(sup, "crasher", "exit", "3")
    first_pid = svc.pid
    svc.proc.wait()
    sup.supervise_once()
    assert svc.restarts == 1 and svc.pid != first_pid
    svc.proc.wait()
    sup.supervise_once()
    assert svc.restarts == 1 and svc.proc.poll() == 3  # budget spent: left down
    assert (sup.run_root / ".libra" / "logs" / "crasher.out").exists()


def test_a_service_up_for_the_stable_period_gets_its_budget_back(supervisor) -> None:
    sup, clock = supervisor
    svc = _service(sup, "flaky", "sleep")
    svc.restarts = 1  # it crashed once earlier
    clock.now_s += STABLE_S - 1
    sup.supervise_once()
    assert svc.restarts == 1
    clock.now_s += 1
    sup.supervise_once()
    assert svc.restarts == 0
    os.kill(svc.pid, signal.SIGKILL)  # a crash much later is restarted again
    svc.proc.wait()
    sup.supervise_once()
    assert svc.restarts == 1 and svc.proc.poll() is None


def test_a_killed_redis_comes_back_on_its_port_with_its_data(supervisor,
                                                              tmp_path: Path) -> None:
    sup, _ = supervisor
    sup.redis = start_redis(tmp_path / "redis")
    port, old_pid = sup.redis.port, sup.redis.pid
    client = redis_sync.Redis(port=port)
    client.set("libra:test", "kept")
    client.bgrewriteaof()
    while any(int(client.info("persistence")[k]) for k in ("aof_rewrite_in_progress",
                                                             "aof_rewrite_scheduled")):
        time.sleep(0.01)  # its end (milliseconds) is what makes the key durable
    client.close()
    os.kill(old_pid, signal.SIGKILL)
    sup.redis.process.wait()
    sup.supervise_once()
    assert sup.redis.port == port and sup.redis.pid != old_pid
    assert sup.redis_restarts == 1
    assert redis_sync.Redis(port=port).get("libra:test") == b"kept"
