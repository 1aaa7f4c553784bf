"""Lease snapshots that were not changed are not sent again: the Redis store's scripts
return the leases' rows only when their digest differs from the one the store holds
(at 1,000 instances a snapshot every 0.25 s decoded 1,000 rows that had not changed).

Every change a snapshot must see (a worker that comes or goes, a new epoch, role or
bucket) is checked on both stores, through ``lease_snapshot`` and the tick's read; the
Redis side's saving and its one race are checked on the real redis-server.
"""

from __future__ import annotations

from typing import Any

from libra import redis_keys as keys
from libra import types as t
from services.scheduler.state import LeaseSnapshot
from services.scheduler.store import RedisSchedulerStore
from tests.store import test_scheduler_store_contract as contract
from tests.store.test_scheduler_store_contract import JOB, World, placed

world = contract.world  # the fixture: both stores

ROLLOUT = t.WorkerRole.CORE_ROLLOUT


def seen(snapshot: LeaseSnapshot) -> tuple[dict[str, int], list[tuple[str, str, int]]]:
    return snapshot.epochs, [(i.instance_id, i.bucket, i.active_trajectories)
                             for i in snapshot.instances]


async def tick_snapshot(world: World) -> LeaseSnapshot:
    state = await world.store.tick_state(JOB, ">", 1, with_leases=True)
    assert state.leases is not None
    return state.leases


async def test_every_lease_change_is_seen_after_an_unchanged_snapshot(world: World) -> None:
    await world.job()
    await world.lease("ro-0", ROLLOUT, "short", 1)
    await world.lease("ro-1", ROLLOUT, "long", 1)
    await placed(world, "t0", "t1", instance="ro-0")
    first = seen(await world.store.lease_snapshot(JOB))
    assert first == ({"ro-0": 1, "ro-1": 1}, [("ro-0", "short", 2), ("ro-1", "long", 0)])
    # Unchanged leases, changed loads: the loads are read every time.
    await placed(world, "t2", instance="ro-1")
    assert seen(await tick_snapshot(world)) == (
        first[0], [("ro-0", "short", 2), ("ro-1", "long", 1)])
    assert seen(await world.store.lease_snapshot(JOB)) == seen(await tick_snapshot(world))
    # A new epoch, a new bucket, a new role, a new worker: each seen at once.
    await world.lease("ro-0", ROLLOUT, "short", 2)
    assert (await tick_snapshot(world)).epochs["ro-0"] == 2
    await world.lease("ro-1", ROLLOUT, "short", 1)
    assert seen(await world.store.lease_snapshot(JOB))[1][1] == ("ro-1", "short", 1)
    await world.lease("ro-1", t.WorkerRole.HYBRID_TRAINING, "short", 1)
    assert [i.instance_id for i in (await tick_snapshot(world)).instances] == ["ro-0"]
    await world.lease("ro-2", ROLLOUT, "long", 4)
    assert (await world.store.lease_snapshot(JOB)).epochs == {"ro-0": 2, "ro-1": 1, "ro-2": 4}


async def test_a_lease_gone_is_seen_after_an_unchanged_snapshot(world: World) -> None:
    await world.job()
    await world.lease("ro-0", ROLLOUT, "short", 1)
    await world.lease("ro-1", ROLLOUT, "short", 1)
    await tick_snapshot(world)
    await tick_snapshot(world)  # unchanged
    if world.redis is None:
        world.store.expire_lease("ro-1")
    else:  # expired: the key is gone, the worker still in the set
        await world.redis.delete(keys.lease("ro-1"))
    assert (await tick_snapshot(world)).epochs == {"ro-0": 1}
    assert (await world.store.lease_snapshot(JOB)).epochs == {"ro-0": 1}


class Replies:
    """Wraps a store's script to keep what it answered."""

    def __init__(self, script: Any) -> None:
        self.script, self.replies = script, []

    async def __call__(self, **kwargs: Any) -> Any:
        reply = await self.script(**kwargs)
        self.replies.append(reply)
        return reply


async def test_unchanged_leases_come_without_their_rows(redis_bytes: Any) -> None:
    world = World(RedisSchedulerStore(redis_bytes), redis_bytes)
    await world.job()
    for i in range(3):
        await world.lease(f"ro-{i}", ROLLOUT, "short", 1)
    store = world.store
    store._tick, store._leases = Replies(store._tick), Replies(store._leases)
    first = seen(await tick_snapshot(world))
    assert seen(await tick_snapshot(world)) == first
    assert seen(await store.lease_snapshot(JOB)) == first
    rows = [reply[4] for reply in store._tick.replies] + [store._leases.replies[0][0]]
    assert [len(r) for r in rows] == [3, 0, 0]  # the first read's rows only
    await world.lease("ro-1", ROLLOUT, "short", 2)
    assert len((await store._leases(keys=[keys.WORKERS, keys.load(JOB)],
                                    args=[keys.lease(""), "1", store._lease_digest,
                                          "role", "bucket", "epoch"]))[0]) == 3


async def test_an_unchanged_reply_to_an_older_digest_keeps_that_snapshot(
        redis_bytes: Any) -> None:
    """Two reads in flight: the first sent digest A and is answered "unchanged" after
    the second one, which saw a change, stored digest B. The first gets A's leases
    (not B's, nor none: an empty snapshot would depart every instance)."""
    world = World(RedisSchedulerStore(redis_bytes), redis_bytes)
    await world.lease("ro-0", ROLLOUT, "short", 1)
    store = world.store
    before = await store.lease_snapshot("")
    sent = store._lease_digest, store._lease_summaries
    await world.lease("ro-1", ROLLOUT, "short", 1)
    assert (await store.lease_snapshot("")).epochs == {"ro-0": 1, "ro-1": 1}
    assert store._summaries([], sent[0], sent) == sent[1]
    assert [s.worker_id for s in sent[1] if s] == list(before.epochs) == ["ro-0"]
    assert {s.worker_id for s in store._lease_summaries if s} == {"ro-0", "ro-1"}
