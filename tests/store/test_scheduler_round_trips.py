"""What a scheduler tick costs in Redis round trips, and what a failed tick leaves behind.

On a small host every round trip is a wake-up of the scheduler process, so a tick is one
read (status, counters, finishes given back, leases when due) and at most one write
(placements, admissions and the policy's state, in one MULTI)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.jobspec import JobSpec
from libra_cli.redis_server import EmbeddedRedis
from services.scheduler.core import SchedulerCore
from services.scheduler.state import TickWrites
from services.scheduler.store import _REQUEUE_LUA as REQUEUE_LUA
from services.scheduler.store import FlushablePolicyStore, RedisSchedulerStore
from tests.store.test_scheduler_core_on_redis import lease, load, publish_finish
from tests.unit.scheduler.test_scheduler_core import JOB, make_spec


class CountingConnection(Connection):
    """A connection that counts what it sends: one send is one round trip (a pipeline
    or a MULTI goes out in one send)."""

    sends = 0

    async def send_packed_command(self, command, check_health=True):  # noqa: ANN001, ANN201
        CountingConnection.sends += 1
        return await super().send_packed_command(command, check_health)


@pytest.fixture
async def r(redis_server: EmbeddedRedis) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_server.url, decode_responses=False,
                               connection_class=CountingConnection)
    await client.flushdb()
    yield client
    await client.aclose()


async def add_job(r: aioredis.Redis, spec: JobSpec) -> None:
    await r.hset(keys.job(JOB), mapping={"spec_json": spec.to_json(), "state": "running"})
    await r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await r.hset(keys.policy(JOB), mapping={"version": 0})


async def counters(r: aioredis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(keys.counters(JOB))).items()}


async def round_trips(core: SchedulerCore) -> int:
    before = CountingConnection.sends
    await core._tick(core._jobs[JOB])
    return CountingConnection.sends - before


async def started(r: aioredis.Redis, store: RedisSchedulerStore | None = None,
                  staleness: int = 0, cap: int = 16) -> SchedulerCore:
    await lease(r, "rollout-0")
    await add_job(r, make_spec(policy="cmlfq", prompts=1, samples=2, staleness=staleness,
                               cap=cap))
    core = SchedulerCore(store or RedisSchedulerStore(r), FakeClock())
    await core.start_job(JOB)
    return core


async def test_a_busy_tick_is_one_read_and_one_write(r: aioredis.Redis) -> None:
    core = await started(r)
    await core._tick(core._jobs[JOB])  # admits the first group (and loads the script)
    first, second = sorted(await core._store.assignments(JOB))
    await publish_finish(r, first)
    await publish_finish(r, second)
    await r.hincrby(keys.counters(JOB), "trained_groups", 1)  # the trainer used them
    # Finishes given back and learnt, leases re-read, the next group admitted and
    # placed, the policy's state written: two round trips.
    assert await round_trips(core) == 2
    assert (await counters(r))["admitted_groups"] == 2
    assert sorted(await core._store.assignments(JOB)) != sorted([first, second])
    assert (await load(r))["rollout-0"] == 2
    assert await r.hlen(keys.sched_trajectories(JOB)) == 2  # the new group's policy state


async def test_an_idle_tick_is_one_read(r: aioredis.Redis) -> None:
    core = await started(r)
    await core._tick(core._jobs[JOB])
    assert await round_trips(core) == 1


async def test_queued_trajectories_are_placed_without_reading_the_queue(
        r: aioredis.Redis) -> None:
    core = await started(r, staleness=1, cap=2)
    await core._tick(core._jobs[JOB])  # the first group placed, the second one queued
    assert await r.hlen(keys.pending(JOB)) == 2
    first = sorted(await core._store.assignments(JOB))[0]
    await publish_finish(r, first)
    assert await round_trips(core) == 2  # the queue is known: it is not read again
    assert await r.hlen(keys.pending(JOB)) == 1
    assert (await load(r))["rollout-0"] == 2


class FailingCommit(RedisSchedulerStore):
    """The Redis store whose first tick commit fails before anything is sent."""

    failures = 1

    async def commit_tick(self, job_id: str, writes: TickWrites,
                          policy_store: FlushablePolicyStore) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("redis went away")
        await super().commit_tick(job_id, writes, policy_store)


async def test_a_failed_commit_is_decided_again_from_what_redis_holds(
        r: aioredis.Redis) -> None:
    core = await started(r, FailingCommit(r))
    with pytest.raises(ConnectionError):
        await core._tick(core._jobs[JOB])
    assert (await counters(r)).get("admitted_groups", 0) == 0
    await core._tick(core._jobs[JOB])
    assert (await counters(r))["admitted_groups"] == 1
    assert await r.xlen(keys.inbox("rollout-0")) == 2
    assert (await load(r))["rollout-0"] == 2
    assert core._jobs[JOB].instances[0].active_trajectories == 2


async def test_a_deleted_trajectory_stream_gets_its_group_back(r: aioredis.Redis) -> None:
    core = await started(r)
    await core._tick(core._jobs[JOB])
    await r.delete(keys.trajectories(JOB))
    await core._tick(core._jobs[JOB])  # NOGROUP: the group is made again, nothing read
    first = sorted(await core._store.assignments(JOB))[0]
    await publish_finish(r, first)
    await core._tick(core._jobs[JOB])
    assert first not in await core._store.assignments(JOB)


async def test_the_orphans_of_several_gone_instances_are_requeued_in_one_write(
        r: aioredis.Redis) -> None:
    """Two instances lose their leases at once: the sweep's page holds the work of both,
    re-queued by one read of their tasks and one script (not three round trips per
    instance): read, page, one DEL of both inboxes, tasks, re-queue, the saved placement
    epochs (the sweep ended, so the gone instances' entries go; only when instances
    change), write."""
    for instance in ("rollout-1", "rollout-2"):
        await lease(r, instance)
    core = await started(r, staleness=2, cap=2)
    await core._tick(core._jobs[JOB])
    assigned = await core._store.assignments(JOB)
    gone = {traj for traj, instance in assigned.items() if instance != "rollout-0"}
    assert {assigned[traj] for traj in gone} == {"rollout-1", "rollout-2"}
    for instance in ("rollout-1", "rollout-2"):
        await r.srem(keys.WORKERS, instance)
        await r.delete(keys.lease(instance))
    await r.script_load(REQUEUE_LUA)  # its first use would add a failed EVALSHA and a load
    assert await round_trips(core) == 7
    assert (await counters(r))["requeued"] == len(gone)
    assert set(await core._store.assignments(JOB)).isdisjoint(gone)
    assert (await load(r)).get("rollout-1", 0) == (await load(r)).get("rollout-2", 0) == 0
