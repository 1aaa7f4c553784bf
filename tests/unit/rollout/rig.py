"""The rollout core under test: the in-memory rollout store (or, given a Redis client,
the Redis one: tests/store), fakes for engine, tool gateway, scheduler and coordinator
(tests/fakes). Shared by the rollout unit tests (the ``rig`` fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import JobSpec, TaskSpec, ToolsSpec
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.memory_store import PublishedEntry
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.engine import FakeEngine, FakeEngineLoader, make_tokenizer
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway
from tests.store.rollout_worlds import MemoryWorld, RedisWorld
from tests.waiting import wait_until

JOB = "job-1"
HERE = "ro-1"
THERE = "ro-2"


def make_task(index: int = 0, prompt: str = "Q:1+2=", reference: str = "3") -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId(f"tr-{index}"), t.JobId(JOB), t.GroupId("g-0"),
                        t.PromptId("p-0"), prompt, reference)




@dataclass
class Rig:
    world: MemoryWorld | RedisWorld
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
        await self.world.set_policy(JOB, t.PolicyInfo(
            version, str(path), sha256 or hashlib.sha256(data).hexdigest(),
            str(self.tmp / "model"), 0))
        return str(path)

    async def place(self, traj: t.Trajectory, instance: str = HERE,
                    assign: bool = True) -> None:
        """As the scheduler places: inbox entry, task, and (``assign``) the assignment
        and load a handoff checks and moves."""
        await self.world.place(traj, instance, assign)

    async def load(self) -> dict[str, int]:
        return await self.world.load(JOB)

    async def published_entries(self) -> list[PublishedEntry]:
        return await self.world.published(JOB)

    async def published(self) -> list[t.Trajectory]:
        return [e.trajectory for e in await self.world.published(JOB)]

    async def num_published(self) -> int:
        return len(await self.world.published(JOB))

    async def counters(self) -> dict[str, int]:
        return await self.world.counters(JOB)

    async def inbox_size(self, instance: str = HERE) -> int:
        return await self.world.inbox_size(instance)

    async def inbox_pending(self, instance: str = HERE) -> int:
        return await self.world.inbox_pending(instance)

    async def events(self, kind: str) -> list[dict[str, str]]:
        return await self.world.events(JOB, kind)

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
        except Exception:  # TimeoutError included: still running (an open episode)
            self.task.cancel()
            # A loop that survives its cancel is a bug (it wedged CI once): say so here,
            # not as a 300 s timeout in a later fixture.
            done, _ = await asyncio.wait([self.task], timeout=60.0)
            where = io.StringIO()
            self.task.print_stack(file=where)
            assert done, f"the rollout loop kept running after task.cancel():\n{where.getvalue()}"


@asynccontextmanager
async def started_rig(tmp_path: Path, *, redis: Any = None, bucket: str = "short",
                      role: t.WorkerRole = t.WorkerRole.CORE_ROLLOUT,
                      spec: JobSpec | None = None, tokenizer: Any = None,
                      lease_ttl_ms: int = 60_000, **core_extra: Any) -> AsyncIterator[Rig]:
    """A registered core with version-0 weights (not yet running) over the in-memory
    store, or over the Redis store on ``redis`` (a bytes-mode client; flushed first);
    by default an arith job over the tiny model's tokenizer."""
    if redis is not None:
        await redis.flushdb()
    world = MemoryWorld() if redis is None else RedisWorld(redis)
    spec = spec or JobSpec(task=TaskSpec(max_turns=4), tools=ToolsSpec(call_timeout_s=5.0))
    await world.put_job(JOB, spec.to_json(), "running")
    clock = FakeClock()
    engine = FakeEngine(tokenizer or make_tokenizer())
    tools = FakeToolGateway(clock=clock)
    scheduler = FakeScheduler()
    # Mirrors the lease into the store: publishing is fenced.
    coordinator = (FakeCoordinator(redis=redis) if redis is not None
                   else FakeCoordinator(mirror_lease=world.store.set_lease))
    settings = RolloutSettings(instance_id=HERE, bucket=bucket, lease_ttl_ms=lease_ttl_ms,
                               tool_deadline_s=5.0, idle_block_ms=5, role=role)
    core = RolloutCore(settings, world.store, FakeEngineLoader(engine), tools,
                       scheduler, coordinator, clock, **core_extra)
    rig = Rig(world, tmp_path, core, engine, tools, scheduler, coordinator, clock)
    await rig.write_weights(0)
    await core.register()
    await world.store.ensure_inbox(THERE)
    try:
        yield rig
    finally:
        await rig.stop()
