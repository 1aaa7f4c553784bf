"""One lease, granted by the coordinator's store, read by the scheduler's and checked
by the rollout's fenced scripts: the three agree on its fields (libra/redis_fields.py)."""

from __future__ import annotations

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import SystemClock
from services.coordinator.store import RedisCoordinatorStore
from services.rollout.store import RedisRolloutStore
from services.scheduler.store import RedisSchedulerStore

JOB, HERE = "job-1", "ro-1"


def finished() -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId("tr-0"), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", status=t.TrajectoryStatus.FINISHED)


async def granted(redis: aioredis.Redis, role: t.WorkerRole) -> t.Lease:
    coordinator = RedisCoordinatorStore(redis, SystemClock())
    return await coordinator.acquire_lease(t.Lease(
        t.WorkerId(HERE), role, "long", "127.0.0.1:1", 0, 0, 60_000))


async def inbox_entry(r: aioredis.Redis, store: RedisRolloutStore) -> str:
    await store.ensure_inbox(HERE)
    await r.xadd(keys.inbox(HERE), {"job_id": JOB, "task": b""})
    reply = await r.xreadgroup(keys.ROLLOUT_GROUP, HERE, {keys.inbox(HERE): ">"}, count=1)
    return reply[0][1][0][0].decode()


async def test_the_scheduler_reads_the_granted_role_bucket_and_epoch(
        redis: aioredis.Redis, redis_bytes: aioredis.Redis) -> None:
    lease = await granted(redis, t.WorkerRole.CORE_ROLLOUT)
    await redis_bytes.hset(keys.load(JOB), HERE, 3)
    scheduler = RedisSchedulerStore(redis_bytes)
    snapshot = await scheduler.lease_snapshot(JOB)
    assert snapshot.epochs == {HERE: lease.epoch}
    assert snapshot.instances == [t.InstanceLoad(t.InstanceId(HERE), "long", 3)]
    # The tick script reads the same fields by the same names.
    ticked = await scheduler.tick_state(JOB, ">", 8, with_leases=True)
    assert ticked.leases == snapshot


async def test_the_coordinator_reads_back_what_it_wrote(redis: aioredis.Redis) -> None:
    lease = await granted(redis, t.WorkerRole.HYBRID_ROLLOUT)
    (live,) = await RedisCoordinatorStore(redis, SystemClock()).live_leases()
    assert (live.worker_id, live.role, live.bucket, live.address, live.epoch, live.ttl_ms) \
        == (lease.worker_id, lease.role, lease.bucket, lease.address, lease.epoch,
            lease.ttl_ms)


async def test_the_rollout_publishes_at_the_granted_epoch_only(
        redis: aioredis.Redis, redis_bytes: aioredis.Redis) -> None:
    lease = await granted(redis, t.WorkerRole.CORE_ROLLOUT)
    rollout = RedisRolloutStore(redis_bytes)
    assert not await rollout.publish(finished(), HERE, await inbox_entry(redis_bytes, rollout),
                                     lease.epoch - 1)
    assert await rollout.publish(finished(), HERE, await inbox_entry(redis_bytes, rollout),
                                 lease.epoch)


async def test_a_role_change_is_seen_by_the_scheduler_with_its_new_epoch(
        redis: aioredis.Redis, redis_bytes: aioredis.Redis) -> None:
    lease = await granted(redis, t.WorkerRole.HYBRID_ROLLOUT)
    changed = await RedisCoordinatorStore(redis, SystemClock()).change_role(
        HERE, lease.epoch, t.WorkerRole.HYBRID_TRAINING)
    snapshot = await RedisSchedulerStore(redis_bytes).lease_snapshot(JOB)
    assert changed.epoch > lease.epoch
    assert snapshot.epochs == {HERE: changed.epoch}
    assert snapshot.instances == []  # lent to training: no placements
