"""SchedulerCore on a real Redis: finishes read from the job's trajectory stream through
the scheduler's consumer group (acknowledged with the release; re-read after a restart;
an older rollout's entry decoded whole) and a decided move committed by the rollout's
handoff script. What only Redis does; the rest of
the core's behaviour is unit-tested on the in-memory store (tests/unit/scheduler)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.wire.common import encode_trajectory
from services.rollout.store import RedisRolloutStore
from services.scheduler.core import SchedulerCore
from services.scheduler.store import RedisSchedulerStore
from tests.unit.scheduler.test_scheduler_cmlfq import cmlfq_spec, decide_a_move
from tests.unit.scheduler.test_scheduler_core import JOB, make_spec


async def add_job(r: aioredis.Redis) -> None:
    spec = make_spec(prompts=1, samples=2)
    await r.hset(keys.job(JOB), mapping={"spec_json": spec.to_json(), "state": "running"})
    await r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await r.hset(keys.policy(JOB), mapping={"version": 0})


@pytest.fixture
def r(redis_bytes: aioredis.Redis) -> aioredis.Redis:
    return redis_bytes


async def lease(r: aioredis.Redis, instance: str, bucket: str = "short",
                role: str = "core-rollout", epoch: int = 1) -> None:
    await r.sadd(keys.WORKERS, instance)
    await r.hset(keys.lease(instance), mapping={"role": role, "bucket": bucket,
                                                "epoch": epoch})


async def started(r: aioredis.Redis, clock: FakeClock | None = None,
                  **_spec_args: int | str) -> SchedulerCore:
    await add_job(r)
    core = SchedulerCore(RedisSchedulerStore(r), clock or FakeClock())
    await core.start_job(JOB)
    return core


async def load(r: aioredis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(keys.load(JOB))).items()}


async def publish_finish(r: aioredis.Redis, traj_id: str, total_tokens: int = 40,
                         with_fields: bool = True) -> None:
    """What the rollout's publish appends to the job's trajectory stream."""
    traj = t.Trajectory(t.TrajectoryId(traj_id), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", status=t.TrajectoryStatus.FINISHED)
    entry: dict[str, str | bytes] = {"trajectory_id": traj_id, "data": encode_trajectory(traj)}
    if with_fields:
        entry |= {"total_tokens": str(total_tokens), "status": "finished"}
    await r.xadd(keys.trajectories(JOB), entry)


async def test_finish_in_the_stream_gives_the_slot_back_and_is_acked(
        r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first, second = sorted(await core._store.assignments(JOB))
    await publish_finish(r, first)
    await publish_finish(r, second, with_fields=False)  # an older rollout: decoded whole
    await core._tick(core._jobs[JOB])
    assert await core._store.assignments(JOB) == {}
    assert (await load(r))["rollout-0"] == 0
    pending = await r.xpending(keys.trajectories(JOB), keys.SCHEDULER_GROUP)
    assert pending["pending"] == 0


async def test_finish_read_twice_releases_once(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first = sorted(await core._store.assignments(JOB))[0]
    await publish_finish(r, first)
    await core._tick(core._jobs[JOB])
    # A restarted scheduler re-reads from the start of its group's pending list.
    fresh = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await fresh.start_job(JOB)
    await r.xgroup_setid(keys.trajectories(JOB), keys.SCHEDULER_GROUP, "0")
    await fresh._tick(fresh._jobs[JOB])
    assert (await load(r))["rollout-0"] == 1


async def test_finish_delivered_but_not_acked_is_read_again_after_a_restart(
        r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first = sorted(await core._store.assignments(JOB))[0]
    await publish_finish(r, first)
    # The previous process read it (delivered) and died before releasing it.
    await r.xreadgroup(keys.SCHEDULER_GROUP, keys.SCHEDULER_GROUP,
                       {keys.trajectories(JOB): ">"})
    fresh = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await fresh.start_job(JOB)
    await fresh._tick(fresh._jobs[JOB])
    assert first not in await fresh._store.assignments(JOB)
    assert (await load(r))["rollout-0"] == 1


async def test_handoff_commits_the_decided_move(r: aioredis.Redis) -> None:
    await r.hset(keys.job(JOB), mapping={"spec_json": cmlfq_spec().to_json(),
                                         "state": "running"})
    await r.hset(keys.policy(JOB), mapping={"version": 0})
    await lease(r, "rollout-0", "short")
    await lease(r, "rollout-1", "long")
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await core.start_job(JOB)
    core, traj_id, before = await decide_a_move(core)
    traj = await core._store.task(JOB, traj_id)
    assert traj is not None
    assert await RedisRolloutStore(r).handoff(traj, "rollout-0", "0-1", "rollout-1", "long", 1)
    assert (await core._store.assignments(JOB))[traj_id] == "rollout-1"
    assert await load(r) == {"rollout-0": 3, "rollout-1": 1}
    after = await core._store.counters(JOB)
    assert {k: after[k] - before.get(k, 0) for k in after} == {
        **{k: 0 for k in after}, "migrations": 1, "placed:long": 1}
