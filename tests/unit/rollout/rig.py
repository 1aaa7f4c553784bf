"""The rollout core under test: a real Redis store, fakes for engine, tool gateway,
scheduler and coordinator (tests/fakes). Shared by the rollout unit tests (the ``rig``
fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import JobSpec, TaskSpec, ToolsSpec
from libra.wire.common import decode_trajectory, encode_trajectory
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.store import RedisRolloutStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.engine import FakeEngine, FakeEngineLoader, make_tokenizer
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway
from tests.waiting import wait_until

JOB = "job-1"
HERE = "ro-1"
THERE = "ro-2"


def make_task(index: int = 0, prompt: str = "Q:1+2=", reference: str = "3") -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId(f"tr-{index}"), t.JobId(JOB), t.GroupId("g-0"),
                        t.PromptId("p-0"), prompt, reference)




@dataclass
class Rig:
    r: aioredis.Redis
    tmp: Path
    core: RolloutCore
    engine: FakeEngine
    tools: FakeToolGateway
    scheduler: FakeScheduler
    coordinator: FakeCoordinator
    clock: FakeClock
    task: asyncio.Task | None = None

    async def write_weights(self, version: int, sha256: str | None = None) -> str:
        path = self.tmp / f"v{version}.safetensors"
        data = f"weights v{version}".encode()
        path.write_bytes(data)
        await self.r.hset(keys.policy(JOB), mapping={
            "version": version, "weights_path": str(path),
            "sha256": sha256 or hashlib.sha256(data).hexdigest(),
            "model_dir": str(self.tmp / "model"), "published_at_ms": 0})
        return str(path)

    async def place(self, traj: t.Trajectory, instance: str = HERE,
                    assign: bool = True) -> None:
        """As the scheduler places: inbox entry, task, and (``assign``) the assignment
        and load a handoff checks and moves."""
        data = encode_trajectory(traj)
        await self.r.xadd(keys.inbox(instance), {"job_id": traj.job_id, "task": data})
        await self.r.hset(keys.tasks(JOB), traj.trajectory_id, data)
        if assign:
            await self.r.hset(keys.assignments(JOB), traj.trajectory_id, instance)
            await self.r.hincrby(keys.load(JOB), instance, 1)

    async def load(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in (await self.r.hgetall(keys.load(JOB))).items()}

    async def published(self) -> list[t.Trajectory]:
        return [decode_trajectory(f[b"data"]) for _, f in await self.r.xrange(
            keys.trajectories(JOB))]

    async def num_published(self) -> int:
        return await self.r.xlen(keys.trajectories(JOB))

    async def inbox_pending(self, instance: str = HERE) -> int:
        return (await self.r.xpending(keys.inbox(instance), keys.ROLLOUT_GROUP))["pending"]

    async def events(self, kind: str) -> list[dict[bytes, bytes]]:
        return [f for _, f in await self.r.xrange(keys.events(JOB)) if f[b"kind"] == kind.encode()]

    def start(self) -> None:
        self.task = asyncio.create_task(self.core.run())

    async def run_until_published(self, count: int = 1) -> list[t.Trajectory]:
        if self.task is None:
            self.start()
        await wait_until(lambda: self._published_at_least(count))
        return await self.published()

    async def _published_at_least(self, count: int) -> bool:
        return await self.num_published() >= count

    async def stop(self) -> None:
        if self.task is None:
            return
        await self.core.drain(0.0)
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 1.0)
        except (TimeoutError, Exception):
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


@asynccontextmanager
async def started_rig(redis_url: str, tmp_path: Path, *, bucket: str = "short",
                      role: t.WorkerRole = t.WorkerRole.CORE_ROLLOUT,
                      spec: JobSpec | None = None, tokenizer: Any = None,
                      lease_ttl_ms: int = 60_000, **core_extra: Any) -> AsyncIterator[Rig]:
    """A registered core on a flushed Redis with version-0 weights (not yet running);
    by default an arith job over the tiny model's tokenizer."""
    r = aioredis.from_url(redis_url, decode_responses=False)
    await r.flushdb()
    spec = spec or JobSpec(task=TaskSpec(max_turns=4), tools=ToolsSpec(call_timeout_s=5.0))
    await r.hset(keys.job(JOB), mapping={"spec_json": spec.to_json(), "state": "running",
                                          "run_dir": str(tmp_path)})
    clock = FakeClock()
    engine = FakeEngine(tokenizer or make_tokenizer())
    tools = FakeToolGateway(clock=clock)
    scheduler = FakeScheduler()
    coordinator = FakeCoordinator(redis=r)  # mirrors the lease: publishing is fenced
    settings = RolloutSettings(instance_id=HERE, bucket=bucket, lease_ttl_ms=lease_ttl_ms,
                               tool_deadline_s=5.0, idle_block_ms=5, role=role)
    core = RolloutCore(settings, RedisRolloutStore(r), FakeEngineLoader(engine), tools,
                       scheduler, coordinator, clock, **core_extra)
    rig = Rig(r, tmp_path, core, engine, tools, scheduler, coordinator, clock)
    await rig.write_weights(0)
    await core.register()
    await r.xgroup_create(keys.inbox(THERE), keys.ROLLOUT_GROUP, id="0", mkstream=True)
    try:
        yield rig
    finally:
        await rig.stop()
        await r.aclose()
