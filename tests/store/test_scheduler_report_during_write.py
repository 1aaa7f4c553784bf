"""A report batch decided while the tick's write is in flight (the gate is ajar during
the tick's Redis awaits: ``SchedulerCore.tick_done``): it is decided as between ticks,
the tick writes what it decided, and what the report changed in the policy's state is
written by the next flush - not lost with the flush under way, which took its changes
before it was sent (``RedisPolicyStore.flush``). Redis holds the write (``CLIENT PAUSE
WRITE``) until the test lets it go: nothing is timed."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.step_timing import StepTimes
from services.scheduler.core import SchedulerCore
from services.scheduler.state import TickWrites
from services.scheduler.store import RedisSchedulerStore
from services.scheduler.store_protocol import FlushablePolicyStore
from tests.store.test_scheduler_core_on_redis import lease
from tests.unit.scheduler.test_scheduler_cmlfq import FAIL, JOB, cmlfq_spec, teach_one_group


class HeldWriteStore(RedisSchedulerStore):
    """Once ``hold`` is set, Redis pauses writes just before the tick's write is sent;
    ``writing`` is set then."""

    def __init__(self, r: aioredis.Redis) -> None:
        super().__init__(r)
        self._redis, self.hold, self.writing = r, False, asyncio.Event()

    async def commit_tick(self, job_id: str, writes: TickWrites,
                          policy_store: FlushablePolicyStore) -> None:
        if self.hold:
            await self._redis.client_pause(60_000, all=False)  # writes wait in Redis
            self.writing.set()
        await super().commit_tick(job_id, writes, policy_store)


async def test_a_report_decided_while_the_write_is_held_is_kept_and_the_write_lands(
        redis_bytes: aioredis.Redis) -> None:
    r = redis_bytes
    await r.hset(keys.job(JOB), mapping={"spec_json": cmlfq_spec().to_json(),
                                         "state": "running"})
    await r.hset(keys.policy(JOB), mapping={"version": 0})
    await lease(r, "rollout-0", "short", epoch=1)
    await lease(r, "rollout-1", "long", epoch=1)
    store, ticks = HeldWriteStore(r), asyncio.Event()

    def observe(_wall_s: float, _own: StepTimes) -> None:
        ticks.set()

    core = SchedulerCore(store, FakeClock(), tick_s=3600.0, observe_tick=observe)
    await core.start_job(JOB)
    await teach_one_group(core, 200)  # the tree says: after this return, long
    run = core._jobs[JOB]
    await core._tick(run)  # a group placed on rollout-0 (the shortest bucket)
    traj_id = sorted(await store.assignments(JOB))[0]
    await store.incr_counters(JOB, trained_groups=1)  # the next tick admits a group
    await run.policy_store.flush()
    flushed = await r.hget(keys.sched_trajectories(JOB), traj_id)
    store.hold = True
    loop = asyncio.create_task(core.run())
    try:
        await store.writing.wait()
        await core.tick_done()  # as the servicer decides a batch
        (decision,) = await core.report_tool_returns(
            "rollout-0", 1, [t.ToolReturnReport(JOB, traj_id, FAIL, 10)])
        assert not ticks.is_set()  # decided while the tick's write is held
    finally:
        await r.client_unpause()
    assert isinstance(decision, t.PlacementDecision)
    assert (decision.action, decision.target_instance) == (t.DecisionAction.MOVE, "rollout-1")
    await ticks.wait()
    await core.drain(0.0)
    loop.cancel()
    # The tick's write landed: the third group admitted, its four placed or queued.
    assert (await store.counters(JOB))["admitted_groups"] == 3
    assert len(await store.assignments(JOB)) + len(await store.pending(JOB)) == 8
    # The report's change to the policy's state, made after the write took its
    # changes, is not in Redis yet; the next flush writes it.
    kept = run.policy_store.get_trajectory(traj_id)
    assert await r.hget(keys.sched_trajectories(JOB), traj_id) == flushed
    assert json.loads(flushed) != kept
    await run.policy_store.flush()
    assert json.loads(await r.hget(keys.sched_trajectories(JOB), traj_id)) == kept
