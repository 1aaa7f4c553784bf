"""The scheduler as deployed (services/scheduler/__main__.py): its tick on a loop and
thread of its own with a Redis client of its own, reports decided on the caller's loop
with another, both over one real Redis and the same jobs (``libra/step_lock.py``).

Conditions are awaited (a placement written, a slot given back), never slept for."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import SystemClock
from libra.errors import FailedPrecondition
from libra.loop_thread import LoopThread
from libra.step_timing import StepTimes
from services.scheduler.core import SchedulerCore
from services.scheduler.store import RedisSchedulerStore
from tests.store.test_scheduler_core_on_redis import add_job, lease, load, publish_finish
from tests.unit.scheduler.test_scheduler_core import JOB

T = TypeVar("T")
OK = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
WAIT_S = 30.0  # at most, for what the tick must do (it ticks every 10 ms)


@pytest.fixture
def r(redis_bytes: aioredis.Redis) -> aioredis.Redis:
    return redis_bytes


@pytest.fixture
async def deployed(r: aioredis.Redis, redis_server: Any,
                   ) -> AsyncIterator[tuple[SchedulerCore, set[str]]]:
    """A core wired as __main__ wires it, its loop running; the threads ticks ran on."""
    tick_thread = LoopThread("scheduler-tick")
    tick_redis = aioredis.from_url(redis_server.url, decode_responses=False)
    ticked_on: set[str] = set()

    def observe(_wall_s: float, _own: StepTimes) -> None:
        ticked_on.add(threading.current_thread().name)

    core = SchedulerCore(RedisSchedulerStore(tick_redis), SystemClock(), tick_s=0.01,
                         observe_tick=observe, report_store=RedisSchedulerStore(r),
                         tick_thread=tick_thread)
    loop_task = asyncio.create_task(core.run())
    yield core, ticked_on
    await core.drain(0.0)
    await loop_task
    await tick_thread.run(tick_redis.aclose())
    tick_thread.stop()


async def until(read: Callable[[], Awaitable[T]], holds: Callable[[T], bool]) -> T:
    """``read()`` once ``holds`` it (polled; fails after WAIT_S)."""
    async with asyncio.timeout(WAIT_S):
        while not holds(value := await read()):
            await asyncio.sleep(0.01)
    return value


async def test_jobs_started_here_are_ticked_on_the_tick_thread(
        r: aioredis.Redis, deployed: tuple[SchedulerCore, set[str]]) -> None:
    core, ticked_on = deployed
    await lease(r, "rollout-0")
    await add_job(r)
    await core.start_job(JOB)  # from this loop: run on the tick's loop, its client
    placed = await until(lambda: r.hgetall(keys.assignments(JOB)), lambda a: len(a) == 2)
    assert set(placed.values()) == {b"rollout-0"}
    assert ticked_on == {"scheduler-tick"}
    # The policy's state went out with the tick's write, on the tick's client.
    assert await r.hlen(keys.sched_trajectories(JOB)) == 2


async def test_reports_are_decided_here_while_the_tick_runs_there(
        r: aioredis.Redis, deployed: tuple[SchedulerCore, set[str]]) -> None:
    core, _ = deployed
    await lease(r, "rollout-0")
    await add_job(r)
    await core.start_job(JOB)
    placed = await until(lambda: r.hgetall(keys.assignments(JOB)), lambda a: len(a) == 2)
    reports = [t.ToolReturnReport(JOB, tid.decode(), OK, 10) for tid in sorted(placed)]
    decisions = await core.report_tool_returns("rollout-0", 1, reports)
    assert [d.action for d in decisions] == [t.DecisionAction.STAY] * 2
    with pytest.raises(FailedPrecondition, match="stale lease epoch"):
        await core.report_tool_returns("rollout-0", 0, reports)
    assert (await core.stats(JOB))["decisions"]
    # Finishes are read back by the tick: the slots are given back.
    for tid in placed:
        await publish_finish(r, tid.decode())
    await until(lambda: r.hlen(keys.assignments(JOB)), lambda n: n == 0)
    assert (await until(lambda: load(r), lambda loads: loads.get("rollout-0") == 0)
            ) == {"rollout-0": 0}


async def test_a_job_stopped_here_is_no_longer_ticked(
        r: aioredis.Redis, deployed: tuple[SchedulerCore, set[str]]) -> None:
    core, _ = deployed
    await lease(r, "rollout-0")
    await add_job(r)
    await core.start_job(JOB)
    await until(lambda: r.hlen(keys.assignments(JOB)), lambda n: n == 2)
    await core.stop_job(JOB)
    assert core.gauges() == []  # read from this thread, as /metrics does
    with pytest.raises(FailedPrecondition, match="not being scheduled"):
        await core.stats(JOB)
