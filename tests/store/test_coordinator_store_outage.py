"""The coordinator store while Redis is briefly unreachable (real redis-server).

The session's redis-server is frozen with SIGSTOP and resumed with SIGCONT by pid, so
commands sent meanwhile time out on the client side but may still run when the server
resumes: exactly the "unknown outcome" a retry must survive. The client under test has
a short socket timeout and no retries of its own, so the store's retry is what runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeout

from libra import redis_keys as keys
from libra import types as t
from libra.clock import SystemClock
from libra_cli.redis_server import EmbeddedRedis
from services.coordinator.store import RedisCoordinatorStore

PAUSE_S = 1.0


@pytest.fixture
async def touchy_redis(redis_server: EmbeddedRedis,
                       redis: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """A client that gives up on a silent server after 0.2 s (``redis`` flushes the db)."""
    client = aioredis.from_url(redis_server.url, decode_responses=True, socket_timeout=0.2,
                               socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    yield client
    await client.aclose()


@contextmanager
def frozen(server: EmbeddedRedis, resume_after_s: float | None) -> Iterator[None]:
    """Freeze redis-server; resume it after ``resume_after_s`` (None: on exit)."""
    os.kill(server.pid, signal.SIGSTOP)
    handle = None
    if resume_after_s is not None:
        handle = asyncio.get_running_loop().call_later(resume_after_s, os.kill, server.pid,
                                                       signal.SIGCONT)
    try:
        yield
    finally:
        if handle is not None:
            handle.cancel()
        os.kill(server.pid, signal.SIGCONT)


def lease(worker_id: str = "w1") -> t.Lease:
    return t.Lease(t.WorkerId(worker_id), t.WorkerRole.HYBRID_ROLLOUT, "short", "a:1", 0, 0,
                   60_000)


async def test_role_change_during_a_pause_applies_exactly_once(
        redis_server: EmbeddedRedis, redis: aioredis.Redis, touchy_redis: aioredis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    store = RedisCoordinatorStore(touchy_redis, SystemClock())
    granted = await store.acquire_lease(lease())
    with caplog.at_level(logging.WARNING), frozen(redis_server, PAUSE_S):
        changed = await store.change_role("w1", granted.epoch,
                                          t.WorkerRole.HYBRID_JOINING)
    assert any("change_role failed" in r.getMessage() for r in caplog.records)
    # One fence increment, whichever try ran first; the lease shows that epoch.
    assert int(await redis.get(keys.FENCE)) == granted.epoch + 1 == changed.epoch
    assert await redis.hget(keys.lease("w1"), "role") == "hybrid-joining"
    assert int(await redis.hget(keys.lease("w1"), "epoch")) == changed.epoch


async def test_renew_and_list_ride_out_a_pause(
        redis_server: EmbeddedRedis, touchy_redis: aioredis.Redis) -> None:
    store = RedisCoordinatorStore(touchy_redis, SystemClock())
    granted = await store.acquire_lease(lease())
    with frozen(redis_server, PAUSE_S):
        renewed = await store.renew_lease("w1", granted.epoch, 0)
    with frozen(redis_server, PAUSE_S):
        live = await store.live_leases()
    assert renewed.epoch == granted.epoch and [x.epoch for x in live] == [granted.epoch]


async def test_outage_longer_than_the_retry_budget_surfaces_the_error(
        redis_server: EmbeddedRedis, touchy_redis: aioredis.Redis) -> None:
    store = RedisCoordinatorStore(touchy_redis, SystemClock(), retry_attempts=2,
                                  retry_first_delay_s=0.05)
    granted = await store.acquire_lease(lease())
    with frozen(redis_server, None), pytest.raises(RedisTimeout):
        await store.change_role("w1", granted.epoch, t.WorkerRole.HYBRID_JOINING)
