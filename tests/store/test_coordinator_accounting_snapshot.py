"""The report's exact accounting is read from one snapshot of Redis.

A job that has ended still has instances finishing the trajectories they held; they
publish (stream entry + ``produced``, one script) while the coordinator reads the job's
counters and its measured backlog. Read apart, such a publish lands on both sides of
``produced == trained + dropped + in_flight_at_end`` - the cancel-and-resume stack test
once reported ``unaccounted`` -4 (admitted 500 = produced 496 + 4 running). A trainer ack
between the reads does the opposite (+1).

Real parts: the session's redis-server, the coordinator's Redis store and core, the
trainer's Redis store (its consume script) and the report. To make the interleaving
deterministic, the coordinator's client runs its commands one at a time and lets a
writer (a publish, or a trainer ack) land after each of them - what a busy machine may
do; a read done as one script leaves no gap for it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import SystemClock
from libra_cli.report import build_report
from services.coordinator.core import CoordinatorCore
from services.coordinator.store import RedisCoordinatorStore
from services.trainer.store import RedisTrainerStore
from tests.fakes.runner import FakeRunner

JOB = "job-acct"
STREAM = keys.trajectories(JOB)


class InterleavingClient:
    """The coordinator's Redis client, with ``between()`` run after each of its commands
    (scripts excepted: Redis runs a script whole, nothing lands inside it)."""

    def __init__(self, real: aioredis.Redis, between: Callable[[], Awaitable[None]]) -> None:
        self._real = real
        self._between = between
        self._one_at_a_time = asyncio.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name in ("register_script", "pipeline") or not callable(attr):
            return _Pipeline(self, attr) if name == "pipeline" else attr
        return lambda *args, **kwargs: self.run(lambda: attr(*args, **kwargs))

    async def run(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async with self._one_at_a_time:
            result = await call()
            await self._between()
            return result


class _Pipeline:
    """``client.pipeline(...)`` whose ``execute`` is one interleaved command."""

    def __init__(self, client: InterleavingClient, make: Callable[..., Any]) -> None:
        self._client, self._make = client, make

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._make(*args, **kwargs)
        client = self._client

        class Hooked:
            def __getattr__(self, name: str) -> Any:
                return getattr(pipe, name)

            async def __aenter__(self) -> Hooked:
                await pipe.__aenter__()
                return self

            async def __aexit__(self, *exc: Any) -> None:
                await pipe.__aexit__(*exc)

            async def execute(self) -> Any:
                return await client.run(pipe.execute)

        return Hooked()


async def publish(redis: aioredis.Redis, traj_id: str) -> None:
    """What the rollout's publish script writes, atomically: the entry and its count."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.xadd(STREAM, {"trajectory_id": traj_id, "data": b""})
        pipe.hincrby(keys.counters(JOB), "produced", 1)
        await pipe.execute()


async def job_with_trajectories_at_each_stage(redis: aioredis.Redis,
                                              trainer: RedisTrainerStore) -> list[str]:
    """4 published: 1 trained, 1 dropped stale, 1 delivered and held (unacked), 1 not yet
    delivered; 2 running on instances; 1 admitted, not yet placed. Returns the entry ids
    of the held and the undelivered ones."""
    store = RedisCoordinatorStore(redis, SystemClock())
    await store.put_job(t.Job(job_id=t.JobId(JOB), name="n", state=t.JobState.RUNNING,
                              spec_json=json.dumps({"name": "n"}), created_at_ms=1,
                              updated_at_ms=1, message="", step=1, policy_version=1,
                              run_dir="/runs/job-acct"))
    await redis.xgroup_create(STREAM, keys.TRAINER_GROUP, id="0", mkstream=True)
    for i in range(3):
        await publish(redis, f"tr-{i}")
    reply = await redis.xreadgroup(keys.TRAINER_GROUP, "trainer-0", {STREAM: ">"})
    ids = [entry_id for entry_id, _ in reply[0][1]]
    await trainer.consume(JOB, [ids[0]], ["tr-0"], trained=1)
    await trainer.consume(JOB, [ids[1]], ["tr-1"], dropped_stale=1)
    await publish(redis, "tr-3")
    await redis.hset(keys.assignments(JOB), mapping={"tr-4": "ro-0", "tr-5": "ro-1"})
    await redis.hset(keys.pending(JOB), "tr-6", "task")
    last = await redis.xrevrange(STREAM, count=1)
    return [ids[2], last[0][0]]


async def accounting_read_while(redis: aioredis.Redis,
                                writer: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    """GetJob's counters, read by the core while ``writer`` lands between commands, as
    the report's trajectory accounting."""
    store = RedisCoordinatorStore(InterleavingClient(redis, writer), SystemClock())
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), SystemClock(), Path("/tmp"))
    job, steps, counters = await core.get_job(JOB)
    return build_report(job, steps, counters, 0.0)["trajectories"]


async def test_publishes_landing_while_getjob_reads_leave_nothing_unaccounted(
        redis: aioredis.Redis, redis_bytes: aioredis.Redis) -> None:
    await job_with_trajectories_at_each_stage(redis, RedisTrainerStore(redis_bytes))
    # More running than GetJob sends commands: one finishes after each of them.
    running = [f"tr-r{i}" for i in range(10)]
    await redis.hset(keys.assignments(JOB), mapping=dict.fromkeys(running, "ro-2"))

    async def an_instance_publishes() -> None:
        if running:
            await publish(redis, running.pop())

    report = await accounting_read_while(redis, an_instance_publishes)
    assert report["accounting"] == "measured"
    assert report["unaccounted"] == 0, report
    assert report["produced"] == (report["trained"] + report["dropped_stale"]
                                  + report["dropped_failed"] + report["in_flight_at_end"])


async def test_trainer_acks_landing_while_getjob_reads_leave_nothing_unaccounted(
        redis: aioredis.Redis, redis_bytes: aioredis.Redis) -> None:
    trainer = RedisTrainerStore(redis_bytes)
    held, _undelivered = await job_with_trajectories_at_each_stage(redis, trainer)
    await trainer.consume(JOB, [held], ["tr-2"], trained=1)
    # More waiting than GetJob sends commands: the trainer takes one after each of them.
    for i in range(10):
        await publish(redis, f"tr-w{i}")

    async def the_trainer_takes_one() -> None:
        reply = await redis.xreadgroup(keys.TRAINER_GROUP, "trainer-0", {STREAM: ">"},
                                       count=1)
        for entry_id, fields in reply[0][1] if reply else []:
            await trainer.consume(JOB, [entry_id], [fields["trajectory_id"]], trained=1)

    report = await accounting_read_while(redis, the_trainer_takes_one)
    assert report["unaccounted"] == 0, report


async def test_the_snapshot_measures_each_stage_of_a_quiet_job(
        redis: aioredis.Redis, redis_bytes: aioredis.Redis) -> None:
    await job_with_trajectories_at_each_stage(redis, RedisTrainerStore(redis_bytes))
    report = await accounting_read_while(redis, lambda: asyncio.sleep(0))
    assert (report["produced"], report["trained"], report["dropped_stale"]) == (4, 1, 1)
    assert (report["in_flight_at_end"], report["running_at_end"],
            report["pending_admission_at_end"], report["unaccounted"]) == (2, 2, 1, 0)
