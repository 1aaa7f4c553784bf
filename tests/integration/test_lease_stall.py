"""No lease expires while its holder is alive when Redis or the coordinator stalls for
less than the lease's margin (real processes: redis-server, the coordinator; the
holders are the rollout's ``LeaseKeeper`` over gRPC).

A stall is a SIGSTOP of the process for ``STALL_S`` (a host or disk stall stops Redis
the same way). Leases are asked for ``TTL_MS`` and granted as asked
(``lease_renewals_per_s = 0``), renewed every third of it: whenever a stall starts, a
lease has at least two thirds of its TTL left (6 s), so a 3 s stall leaves 3 s for the
renewal that waited to land. Redis expires a lease by its own clock, so a stall longer
than that margin loses it whatever the holder does (libra/lease_timing.py).

What must hold after each stall and one renewal period more: no holder was told its
lease was lost, and every lease is still in Redis under the epoch it was granted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra_cli.redis_server import EmbeddedRedis, free_ports, start_redis
from libra_cli.stack import health
from services.rollout.lease_keeper import LeaseKeeper
from services.rollout.loop_types import LeaseHolder, RolloutSettings
from services.rollout.store import RedisRolloutStore

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TTL_MS = 9_000
STALL_S = 3.0
NUM_HOLDERS = 20


@dataclass
class Holders:
    keepers: list[LeaseKeeper]
    held: list[LeaseHolder]
    lost: list[str] = field(default_factory=list)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A server of this test's own: it is stopped and resumed."""
    server = start_redis(tmp_path / "redis")
    yield server
    os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@pytest.fixture
def coordinator(own_redis: EmbeddedRedis, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The coordinator as a process: (address, pid)."""
    (port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIBRA_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.coordinator", f"--server.port={port}",
         "--http-port=-1", "--server.metrics-port=-1", f"--run-root={tmp_path}",
         "--lease-renewals-per-s=0", f"--redis-url={own_redis.url}"],
        cwd=ROOT, env=env, stdout=(tmp_path / "coordinator.log").open("w"),
        stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        for _ in range(600):
            if health(address, timeout_s=0.5) == "SERVING":
                break
            assert proc.poll() is None, (tmp_path / "coordinator.log").read_text()
            time.sleep(0.1)
        else:
            pytest.fail("the coordinator did not serve")
        yield address, proc.pid
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
async def holders(coordinator: tuple[str, int],
                  own_redis: EmbeddedRedis) -> AsyncIterator[Holders]:
    r = aioredis.from_url(own_redis.url, decode_responses=False)
    client = GrpcCoordinatorClient(coordinator[0])
    stopping = asyncio.Event()
    out = Holders([], [])
    for i in range(NUM_HOLDERS):
        held = LeaseHolder()
        worker = f"rollout-{i}"

        async def on_lost(worker: str = worker) -> None:
            out.lost.append(worker)

        keeper = LeaseKeeper(RolloutSettings(instance_id=worker, bucket="short",
                                             lease_ttl_ms=TTL_MS),
                             RedisRolloutStore(r), client, held, on_lost)
        await keeper.register()
        out.keepers.append(keeper)
        out.held.append(held)
    tasks = [asyncio.create_task(k.heartbeat(stopping.is_set)) for k in out.keepers]
    yield out
    stopping.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    await r.aclose()


async def stall(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(STALL_S)
    finally:
        os.kill(pid, signal.SIGCONT)


async def assert_every_lease_held(holders: Holders, own_redis: EmbeddedRedis) -> None:
    """One renewal period after a stall (a lapse would have been answered by now):
    nobody lost a lease, and Redis holds each under its first epoch."""
    await asyncio.sleep(TTL_MS / 3000)
    assert holders.lost == []
    r = aioredis.from_url(own_redis.url, decode_responses=True)
    try:
        for held in holders.held:
            assert held.lease is not None
            epoch = await r.hget(keys.lease(held.lease.worker_id), "epoch")
            assert epoch == str(held.lease.epoch)
    finally:
        await r.aclose()


async def test_a_redis_stall_shorter_than_the_margin_loses_no_lease(
        holders: Holders, own_redis: EmbeddedRedis) -> None:
    epochs = [h.epoch for h in holders.held]
    await asyncio.sleep(TTL_MS / 3000)  # every holder renewed once
    await stall(own_redis.process.pid)
    await assert_every_lease_held(holders, own_redis)
    assert [h.epoch for h in holders.held] == epochs


async def test_a_coordinator_stall_shorter_than_the_margin_loses_no_lease(
        holders: Holders, coordinator: tuple[str, int],
        own_redis: EmbeddedRedis) -> None:
    epochs = [h.epoch for h in holders.held]
    await asyncio.sleep(TTL_MS / 3000)
    await stall(coordinator[1])
    await assert_every_lease_held(holders, own_redis)
    assert [h.epoch for h in holders.held] == epochs
    assert all(h.lease is not None and h.lease.role is t.WorkerRole.CORE_ROLLOUT
               for h in holders.held)
