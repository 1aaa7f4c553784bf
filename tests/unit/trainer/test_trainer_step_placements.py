"""Per-step scheduler activity in the trainer's step record (report.json ``steps[]``):
``migrations`` and ``bucket_occupancy`` are deltas of the job's cumulative counters.
Real Redis through ``RedisTrainerStore``; the rest of the trainer is not involved."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra.clock import FakeClock
from services.trainer.core import TrainerCore
from services.trainer.store import RedisTrainerStore

JOB = "job-1"


@pytest.fixture
def r(redis_bytes: aioredis.Redis) -> aioredis.Redis:
    return redis_bytes


def make_core(r: aioredis.Redis) -> TrainerCore:
    unused: Any = None
    return TrainerCore(RedisTrainerStore(r), unused, unused, FakeClock())


async def test_store_reads_counters_as_ints(r: aioredis.Redis) -> None:
    await r.hincrby(keys.counters(JOB), "placed:short", 3)
    assert await RedisTrainerStore(r).counters(JOB) == {"placed:short": 3}


async def test_step_record_holds_deltas_since_the_previous_step(r: aioredis.Redis) -> None:
    core = make_core(r)
    await r.hset(keys.counters(JOB), mapping={"placed:short": 8, "migrations": 1,
                                              "trained": 4})
    before = await core._store.counters(JOB)
    await r.hincrby(keys.counters(JOB), "placed:short", 4)
    await r.hincrby(keys.counters(JOB), "placed:long", 2)
    await r.hincrby(keys.counters(JOB), "migrations", 2)
    now, record = await core._placement_deltas(JOB, before)
    assert record == {"migrations": 2, "bucket_occupancy": {"long": 2, "short": 4}}
    _, second = await core._placement_deltas(JOB, now)
    assert second == {"migrations": 0, "bucket_occupancy": {"long": 0, "short": 0}}
