"""RedisRolloutStore.publish against a real Redis: fenced by the lease epoch, atomic."""

from __future__ import annotations

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory
from services.rollout.store import RedisRolloutStore

JOB, HERE = "job-1", "ro-1"


def finished() -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId("tr-0"), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", status=t.TrajectoryStatus.FINISHED)


async def inbox_entry(r: aioredis.Redis, store: RedisRolloutStore) -> str:
    await store.ensure_inbox(HERE)
    await r.xadd(keys.inbox(HERE), {"job_id": JOB, "task": b""})
    reply = await r.xreadgroup(keys.ROLLOUT_GROUP, HERE, {keys.inbox(HERE): ">"}, count=1)
    return reply[0][1][0][0].decode()


async def test_publish_at_the_current_epoch_appends_acks_and_counts(
        redis_bytes: aioredis.Redis) -> None:
    r, store = redis_bytes, RedisRolloutStore(redis_bytes)
    await r.hset(keys.lease(HERE), mapping={"role": "core-rollout", "epoch": 4})
    entry_id = await inbox_entry(r, store)
    assert await store.publish(finished(), HERE, entry_id, 4)
    ((_, fields),) = await r.xrange(keys.trajectories(JOB))
    assert decode_trajectory(fields[b"data"]).trajectory_id == "tr-0"
    assert fields[b"status"] == b"finished"
    assert await r.xlen(keys.inbox(HERE)) == 0
    assert await r.hget(keys.counters(JOB), "produced") == b"1"


async def test_publish_at_a_stale_epoch_writes_nothing(redis_bytes: aioredis.Redis) -> None:
    r, store = redis_bytes, RedisRolloutStore(redis_bytes)
    await r.hset(keys.lease(HERE), mapping={"role": "core-rollout", "epoch": 5})
    entry_id = await inbox_entry(r, store)
    assert not await store.publish(finished(), HERE, entry_id, 4)
    assert await r.xlen(keys.trajectories(JOB)) == 0
    assert await r.xlen(keys.inbox(HERE)) == 1  # still pending: re-placeable
    assert not await r.exists(keys.counters(JOB))


async def test_publish_without_a_lease_writes_nothing(redis_bytes: aioredis.Redis) -> None:
    r, store = redis_bytes, RedisRolloutStore(redis_bytes)
    entry_id = await inbox_entry(r, store)
    assert not await store.publish(finished(), HERE, entry_id, 1)
    assert await r.xlen(keys.trajectories(JOB)) == 0


async def test_a_repeat_publish_of_a_trajectory_is_counted_not_appended(
        redis_bytes: aioredis.Redis) -> None:
    # The first try was applied but its reply lost (Redis restarted): the retry must not
    # make the trainer see the trajectory twice, nor count it produced twice.
    r, store = redis_bytes, RedisRolloutStore(redis_bytes)
    await r.hset(keys.lease(HERE), mapping={"role": "core-rollout", "epoch": 4})
    assert await store.publish(finished(), HERE, await inbox_entry(r, store), 4)
    assert await store.publish(finished(), HERE, await inbox_entry(r, store), 4)
    assert await r.xlen(keys.trajectories(JOB)) == 1
    assert await r.xlen(keys.inbox(HERE)) == 0  # the repeat's entry is acked too
    counters = await r.hgetall(keys.counters(JOB))
    assert (counters[b"produced"], counters[b"duplicate_publishes"]) == (b"1", b"1")
