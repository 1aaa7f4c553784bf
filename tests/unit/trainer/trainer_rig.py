"""The trainer core's unit rig: an in-memory store (services/trainer/memory_store.py, so
no redis-server), a fake backend and a fake coordinator (tests/fakes). Trajectories are
appended to the job's stream as the rollout store publishes them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import AlgorithmSpec, JobSpec, TaskSpec
from libra.retry import RetryPolicy
from services.trainer.core import TrainerCore
from services.trainer.memory_store import MemoryTrainerStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.sleep import FakeSleep
from tests.fakes.trainer_backend import FakeBackend, FakeBackendFactory
from tests.waiting import DEFAULT_TIMEOUT_S

JOB = "job-1"


def make_trajectory(group: int, index: int, version: int = 0, reward: float = 1.0,
                    status: t.TrajectoryStatus = t.TrajectoryStatus.FINISHED) -> t.Trajectory:
    """Prompt (2 tokens), a model turn (2 tokens at ``version``), a tool output (1)."""
    return t.Trajectory(
        t.TrajectoryId(f"tr-{group}-{index}"), t.JobId(JOB), t.GroupId(f"g-{group}"),
        t.PromptId(f"p-{group}"), "Q:1+2=", "3", status=status,
        token_ids=[1, 20, 4, 13, 8], num_prompt_tokens=2, loss_mask=[0, 0, 1, 1, 0],
        logprobs=[0.0, 0.0, -0.5, -0.25, 0.0], token_versions=[-1, -1, version, version, -1],
        reward=reward, num_turns=1)


def make_group(group: int, size: int = 2, version: int = 0,
               rewards: tuple[float, ...] = ()) -> list[t.Trajectory]:
    rewards = rewards or (1.0,) * size
    return [make_trajectory(group, i, version, rewards[i]) for i in range(size)]


@dataclass
class Rig:
    store: MemoryTrainerStore
    tmp: Path
    factory: FakeBackendFactory
    coordinator: FakeCoordinator
    cores: list[TrainerCore]
    sleep: FakeSleep | None = None

    @property
    def backend(self) -> FakeBackend:
        return self.factory.backend

    async def set_spec(self, **algorithm: Any) -> JobSpec:
        a = dict(num_steps=1, prompts_per_step=1, samples_per_prompt=2, sft_steps=0,
                 max_staleness=1, sync_interval=1)
        a.update(algorithm)
        spec = JobSpec(task=TaskSpec(num_prompts=64), algorithm=AlgorithmSpec(**a))
        return await self.put_spec(spec)

    async def put_spec(self, spec: JobSpec) -> JobSpec:
        """The job record as the coordinator writes it (running, run dir ``tmp``)."""
        self.store.put_job(JOB, spec.to_json(), str(self.tmp))
        return spec

    def new_core(self, consumer: str = "trainer-0",
                 report_retry: RetryPolicy | None = None) -> TrainerCore:
        """A core whose report backoff runs on a fake clock (``self.sleep`` records it)."""
        clock = FakeClock()
        self.sleep = FakeSleep(clock)
        core = TrainerCore(self.store, self.factory, self.coordinator,
                           clock, consumer=consumer, block_ms=10,
                           report_retry=report_retry, sleep=self.sleep)
        self.cores.append(core)
        return core

    async def write(self, *trajs: t.Trajectory) -> None:
        """As the rollout store publishes: append to the stream and count it produced."""
        for traj in trajs:
            await self.store.append(JOB, traj)
            self.store.add_counters(JOB, produced=1)

    async def run_job(self, core: TrainerCore | None = None,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> TrainerCore:
        """Start the job on a new core (or keep the given one running) until it ends."""
        if core is None:
            core = self.new_core()
            await core.start_job(JOB)
        await asyncio.wait_for(core.wait(), timeout_s)
        return core

    async def counters(self) -> dict[str, int]:
        return await self.store.counters(JOB)

    async def pending(self) -> int:
        return self.store.num_pending(JOB)

    async def num_consumed(self, traj_ids: list[str]) -> int:
        """How many of ``traj_ids`` are in the consumed (idempotency) set."""
        return sum(await self.store.already_consumed(JOB, traj_ids))

    def policy(self) -> t.PolicyInfo | None:
        return self.store.policy(JOB)

    def event_kinds(self) -> list[str]:
        return [event["kind"] for event in self.store.events(JOB)]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    rig = Rig(MemoryTrainerStore(), tmp_path, FakeBackendFactory(), FakeCoordinator(), [])
    await rig.set_spec()
    yield rig
    for core in rig.cores:
        task = core._task  # stop what is still running; a test left it mid-read
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=2.0)
