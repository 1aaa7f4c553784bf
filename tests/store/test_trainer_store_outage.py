"""The trainer store while Redis is briefly unreachable (real redis-server).

As in ``test_coordinator_store_outage.py``: the session's redis-server is frozen with
SIGSTOP and resumed with SIGCONT by pid, so a command sent meanwhile times out on the
client but still runs when the server resumes (an unknown outcome). The client has a
short socket timeout and no retries of its own, so the store's retry is what runs.
Before this, a Redis restart mid-job failed the trainer's job ("Connection reset by
peer"); the fault matrix (tests/integration/test_fault_matrix.py) covers the kill -9.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeout

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import encode_trajectory
from libra_cli.redis_server import EmbeddedRedis
from services.trainer.store import RedisTrainerStore
from tests.store.test_coordinator_store_outage import PAUSE_S, frozen

JOB = "job-outage"


@pytest.fixture
async def touchy_bytes_redis(redis_server: EmbeddedRedis,
                             redis: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """A bytes-mode client (as the trainer's) that gives up on a silent server after
    0.2 s; ``redis`` flushes the database first."""
    client = aioredis.from_url(redis_server.url, socket_timeout=0.2,
                               socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    yield client
    await client.aclose()


def trajectory(traj_id: str) -> t.Trajectory:
    return t.Trajectory(trajectory_id=traj_id, job_id=JOB, group_id="g0", prompt_id="p0",
                        prompt_text="1+1", reference="2")


async def test_consume_during_a_pause_counts_exactly_once(
        redis_server: EmbeddedRedis, redis: aioredis.Redis,
        touchy_bytes_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    store = RedisTrainerStore(touchy_bytes_redis)
    with caplog.at_level(logging.WARNING), frozen(redis_server, PAUSE_S):
        await store.consume(JOB, [], ["a", "b"], trained=2)
    assert any("consume failed" in r.getMessage() for r in caplog.records)
    # The first try ran when the server resumed; the retry was recognised as a repeat.
    assert await redis.hget(keys.counters(JOB), "trained") == "2"
    assert await redis.scard(keys.trained_ids(JOB)) == 2


async def test_a_repeated_consume_changes_nothing(redis: aioredis.Redis,
                                                  touchy_bytes_redis: aioredis.Redis) -> None:
    store = RedisTrainerStore(touchy_bytes_redis)
    for _ in range(2):
        await store.consume(JOB, [], ["a"], dropped_failed=1)
    assert await redis.hgetall(keys.counters(JOB)) == {"dropped_failed": "1"}


async def test_entries_delivered_by_a_lost_read_are_read_again(
        redis_server: EmbeddedRedis, redis: aioredis.Redis,
        touchy_bytes_redis: aioredis.Redis) -> None:
    store = RedisTrainerStore(touchy_bytes_redis)
    await store.ensure_group(JOB)
    await redis.xadd(keys.trajectories(JOB), {"data": encode_trajectory(trajectory("t1"))})
    with frozen(redis_server, PAUSE_S):
        got = await store.read(JOB, "trainer-0", count=64, block_ms=0)
    # The timed-out XREADGROUP delivered t1 when the server resumed (it is pending for
    # this consumer); the retry read the pending entries, so t1 is not stranded.
    assert [traj.trajectory_id for _, traj in got] == ["t1"]


async def test_an_outage_longer_than_the_budget_surfaces_the_error(
        redis_server: EmbeddedRedis, touchy_bytes_redis: aioredis.Redis) -> None:
    store = RedisTrainerStore(touchy_bytes_redis, outage_s=0.3)
    with frozen(redis_server, None), pytest.raises(RedisTimeout):
        await store.counters(JOB)
