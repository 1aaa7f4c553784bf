"""The processes behind benchmarks/bench_control_plane.py: redis-server, the real
coordinator and scheduler, and the synthetic-fleet drivers (control_plane_fleet.py), with
the counters the benchmark samples (CPU seconds, Redis commands, scheduler metrics)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis as redis_sync
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.procstat import cpu_s
from libra import redis_keys as keys
from libra_cli.redis_server import free_ports, start_redis
from libra_cli.stack import health

ROOT = Path(__file__).resolve().parents[1]
JOB = "ctrl-bench"
FLEET = str(ROOT / "benchmarks" / "control_plane_fleet.py")
# The scheduler's histograms the benchmark reads (a base tree without the tick's own
# and CPU time leaves those two out).
HISTOGRAMS = ("libra_scheduler_tick_seconds", "libra_scheduler_tick_own_seconds",
              "libra_scheduler_tick_cpu_seconds", "libra_scheduler_decide_batch_seconds",
              "libra_scheduler_report_tick_wait_seconds")


class Stack:
    """redis-server, coordinator and scheduler as processes; the children that drive them."""

    def __init__(self, tmp: Path, n: str, profile: str = "",
                 renewals_per_s: float = 250.0, services_root: Path = ROOT) -> None:
        """``services_root``: the source tree the coordinator and scheduler run from (a
        base tree's, for an arm of its own; the fleet always runs from this one)."""
        self.tmp, self.procs, self.drivers = tmp, [], []
        # One folder per run: a Redis reusing one would load the last run's dump.
        self.redis = start_redis(tmp / f"redis-{n}")
        coord_port, sched_port, self.metrics_port = free_ports(3)
        self.coordinator_address = f"127.0.0.1:{coord_port}"
        self.scheduler_address = f"127.0.0.1:{sched_port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIBRA_")}
        for name, args in (
                ("coordinator", [f"--server.port={coord_port}", "--http-port=-1",
                                 f"--run-root={tmp}", "--trainer-lost-s=1000000",
                                 f"--lease-renewals-per-s={renewals_per_s}",
                                 "--server.metrics-port=-1"]),
                ("scheduler", [f"--server.port={sched_port}",
                               f"--server.metrics-port={self.metrics_port}"])):
            # --profile: the scheduler under cProfile (scheduler-<run>.prof in the log
            # folder), the whole run ("run") or the measured window ("window": switched
            # by signals, see profile_window.py and profile_signal).
            out = str(tmp / f"scheduler-{n}.prof")
            command = ["-m", f"services.{name}"]
            if name == "scheduler" and profile == "run":
                command = ["-m", "cProfile", "-o", out, *command]
            elif name == "scheduler" and profile == "window":
                command = [str(ROOT / "benchmarks" / "profile_window.py"), out,
                           f"services.{name}"]
            self.procs.append(subprocess.Popen(
                [sys.executable, *command, *args,
                 f"--redis-url={self.redis.url}"], cwd=services_root, env=env,
                stdout=(tmp / f"{name}-{n}.log").open("w"), stderr=subprocess.STDOUT))
        self.coordinator, self.scheduler = self.procs
        self.r = redis_sync.from_url(self.redis.url)
        for address, proc in ((self.coordinator_address, self.coordinator),
                              (self.scheduler_address, self.scheduler)):
            deadline = time.monotonic() + 120.0
            while health(address, timeout_s=0.5) != "SERVING":
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{address} did not serve (logs in {tmp})")
                time.sleep(0.2)

    def profile_signal(self, sig: int) -> None:
        """Start (SIGUSR1) or stop and write (SIGUSR2) the scheduler's window profile."""
        self.scheduler.send_signal(sig)

    def spawn(self, cfg: dict[str, Any]) -> subprocess.Popen:
        driver = subprocess.Popen([sys.executable, FLEET], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        self.command(driver, json.dumps(cfg))
        self.drivers.append(driver)
        return driver

    @staticmethod
    def command(driver: subprocess.Popen, line: str) -> None:
        assert driver.stdin is not None
        driver.stdin.write(line + "\n")
        driver.stdin.flush()

    def scrape(self) -> dict[str, Any]:
        """The scheduler's histograms (cumulative bucket counts) and decisions."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=30) as resp:
            text = resp.read().decode()
        out: dict[str, Any] = {"decisions": 0.0}
        for family in text_string_to_metric_families(text):
            if family.name == "libra_scheduler_decisions":
                out["decisions"] = sum(s.value for s in family.samples
                                       if s.name.endswith("_total"))
            elif family.name in HISTOGRAMS:
                out[family.name] = {float(s.labels["le"]): s.value for s in family.samples
                                    if s.name.endswith("_bucket")}
        return out

    def sample(self) -> dict[str, Any]:
        """Counters at one moment: CPU seconds, Redis commands, scheduler metrics."""
        return {"t": time.monotonic(), "metrics": self.scrape(),
                "cpu": {name: cpu_s(p.pid) for name, p in self.named().items()},
                "redis_cmds": self.r.info("stats")["total_commands_processed"],
                "produced": int(self.r.hget(keys.counters(JOB), "produced") or 0)}

    def named(self) -> dict[str, Any]:
        named = {"coordinator": self.coordinator, "scheduler": self.scheduler,
                 "redis": self.redis.process}
        named.update((f"driver{i}", d) for i, d in enumerate(self.drivers))
        return named

    def stop(self) -> None:
        for proc in self.drivers:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        self.redis.stop()
