"""The lease plane at scale: N synthetic rollout instances against the real coordinator
and scheduler processes over gRPC + Redis.

Starts a real redis-server, ``python -m services.coordinator`` and ``python -m
services.scheduler`` (their own processes, as deployed), then a driver process whose
asyncio tasks are the instances. Each speaks the instances' lease protocol through the
real client (``GrpcCoordinatorClient``): AcquireLease (core-rollout, a bucket, TTL
3000 ms, as a rollout instance's default), then RenewLease every TTL/3 - the rollout
core's own cadence - for the measured window. Reports, per N:

- renewals/s achieved, renewal latency p50/p99/max at the client (ms);
- leases lost while their holder was alive (LeaseLost on renew; target 0);
- coordinator and scheduler CPU (% of one core, /proc), Redis commands/s and memory.

The scheduler has no job to place here: its load is its tick over N live leases (it
re-reads leases and loads every 5th tick). Placement decisions under load are measured
by benchmarks/bench_scheduler_grpc.py.

Usage: ``python benchmarks/bench_control_plane.py [--instances 100 300] [--seconds 20]
[--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis as redis_sync  # noqa: E402

from benchmarks.procstat import cpu_s  # noqa: E402
from libra_cli.redis_server import free_ports, start_redis  # noqa: E402
from libra_cli.stack import health  # noqa: E402

TTL_MS = 3000

# The instances run in a child process (their own event loop and GIL, as instances on
# other hosts would); arguments arrive as JSON on stdin, the summary leaves on stdout.
DRIVER = r'''
import asyncio, json, sys, time
sys.path.insert(0, ROOT)
from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.errors import LeaseLost

async def instance(client, index, cfg, out):
    worker = f"synthetic-{index}"
    lease = await client.acquire_lease(worker, t.WorkerRole.CORE_ROLLOUT,
                                       ("short", "long")[index % 2], "127.0.0.1:1",
                                       cfg["ttl_ms"])
    period = cfg["ttl_ms"] / 3000
    # Renewals spread over the period, as instances that started apart do; only those
    # inside the window [start, start + seconds) are counted.
    await asyncio.sleep(period * index / cfg["n"])
    end = cfg["start"] + cfg["seconds"]
    while time.time() < end:
        began, counted = time.perf_counter(), time.time() >= cfg["start"]
        try:
            lease = await client.renew_lease(worker, lease.epoch)
            if counted:
                out["lat"].append(time.perf_counter() - began)
        except LeaseLost:
            out["lost"] += 1
            lease = await client.acquire_lease(worker, t.WorkerRole.CORE_ROLLOUT, "short",
                                               "127.0.0.1:1", cfg["ttl_ms"])
        await asyncio.sleep(max(0.0, period - (time.perf_counter() - began)))

async def main(cfg):
    clients = [GrpcCoordinatorClient(cfg["address"]) for _ in range(cfg["channels"])]
    out = {"lat": [], "lost": 0}
    await asyncio.gather(*(instance(clients[i % len(clients)], i, cfg, out)
                           for i in range(cfg["n"])))
    for c in clients:
        await c.close()
    lat = sorted(out["lat"])
    pick = lambda q: round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 2)
    print(json.dumps({"renewals": len(lat), "lost": out["lost"], "p50_ms": pick(0.5),
                      "p99_ms": pick(0.99), "max_ms": round(1000 * lat[-1], 2)}))

asyncio.run(main(json.loads(sys.stdin.read())))
'''


def _start(module: str, args: list[str], log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIBRA_")}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_serving(address: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while health(address, timeout_s=0.5) != "SERVING":
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{address} did not serve")
        time.sleep(0.2)


def run(n: int, seconds: float, tmp: Path) -> dict:
    redis = start_redis(tmp / f"redis-{n}")
    coord_port, sched_port = free_ports(2)
    common = ["--server.metrics-port=-1", f"--redis-url={redis.url}"]
    coordinator = _start("services.coordinator", [
        f"--server.port={coord_port}", "--http-port=-1", f"--run-root={tmp}", *common],
        tmp / f"coordinator-{n}.log")
    scheduler = _start("services.scheduler", [f"--server.port={sched_port}", *common],
                       tmp / f"scheduler-{n}.log")
    r = redis_sync.from_url(redis.url)
    try:
        _wait_serving(f"127.0.0.1:{coord_port}", coordinator)
        _wait_serving(f"127.0.0.1:{sched_port}", scheduler)
        cfg = {"address": f"127.0.0.1:{coord_port}", "n": n, "ttl_ms": TTL_MS,
               "seconds": seconds, "start": time.time() + 3.0, "channels": 4}
        driver = subprocess.Popen([sys.executable, "-c", DRIVER.replace("ROOT", repr(
            str(ROOT)), 1)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert driver.stdin is not None
        driver.stdin.write(json.dumps(cfg))
        driver.stdin.close()
        time.sleep(max(0.0, cfg["start"] - time.time()) + 1.0)  # acquired, renewing
        cpu0 = {p: cpu_s(p.pid) for p in (coordinator, scheduler)}
        cmds0, t0 = r.info("stats")["total_commands_processed"], time.monotonic()
        assert driver.stdout is not None
        out = driver.stdout.read()  # until the driver ends (its summary is one line)
        driver.wait(timeout=60)
        wall = time.monotonic() - t0
        stats, memory = r.info("stats"), r.info("memory")
        result = json.loads(out)
        result.update(
            instances=n, seconds=seconds,
            renewals_per_s=round(result["renewals"] / seconds, 1),
            coordinator_cpu_pct=round(100 * (cpu_s(coordinator.pid) - cpu0[coordinator])
                                      / wall, 1),
            scheduler_cpu_pct=round(100 * (cpu_s(scheduler.pid) - cpu0[scheduler]) / wall, 1),
            redis_ops_per_s=round((stats["total_commands_processed"] - cmds0) / wall),
            redis_used_memory_mb=round(memory["used_memory"] / 2**20, 1))
        return result
    finally:
        for proc in (coordinator, scheduler):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true", help="one JSON line per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.instances:
            result = run(n, args.seconds, Path(tmp))
            if args.json:
                print(json.dumps(result))
                continue
            print(f"{n:5d} instances: {result['renewals_per_s']:7.1f} renewals/s, "
                  f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max "
                  f"{result['max_ms']} ms, lost while alive {result['lost']}; coordinator "
                  f"{result['coordinator_cpu_pct']}% CPU, scheduler "
                  f"{result['scheduler_cpu_pct']}% CPU, Redis {result['redis_ops_per_s']} "
                  f"ops/s, {result['redis_used_memory_mb']} MB")


if __name__ == "__main__":
    main()
