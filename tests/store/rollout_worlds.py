"""The two rollout stores under one contract: each world pairs a store with what the
other services write and read around it (the scheduler's placements, the coordinator's
lease record, the trainer's policy pointer), through Redis or in memory."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory, encode_trajectory
from services.rollout.memory_store import MemoryRolloutStore
from services.rollout.store import RedisRolloutStore


class RedisWorld:
    def __init__(self, r: aioredis.Redis) -> None:
        self.r = r
        self.store = RedisRolloutStore(r)

    async def put_job(self, job_id: str, spec_json: str, state: str) -> None:
        await self.r.hset(keys.job(job_id), mapping={"spec_json": spec_json, "state": state})

    async def set_policy(self, job_id: str, policy: t.PolicyInfo) -> None:
        await self.r.hset(keys.policy(job_id), mapping={
            "version": policy.version, "weights_path": policy.weights_path,
            "sha256": policy.sha256, "model_dir": policy.model_dir,
            "published_at_ms": policy.published_at_ms})

    async def set_lease_epoch(self, worker_id: str, epoch: int) -> None:
        await self.r.hset(keys.lease(worker_id), mapping={"role": "core-rollout",
                                                          "epoch": epoch})

    async def place(self, traj: t.Trajectory, instance_id: str, assign: bool = True) -> None:
        data = encode_trajectory(traj)
        await self.r.xadd(keys.inbox(instance_id), {"job_id": traj.job_id, "task": data})
        await self.r.hset(keys.tasks(traj.job_id), traj.trajectory_id, data)
        if assign:
            await self.r.hset(keys.assignments(traj.job_id), traj.trajectory_id, instance_id)
            await self.r.hincrby(keys.load(traj.job_id), instance_id, 1)

    async def drop_inbox(self, instance_id: str) -> None:
        await self.r.delete(keys.inbox(instance_id))

    async def inbox_size(self, instance_id: str) -> int:
        return await self.r.xlen(keys.inbox(instance_id))

    async def inbox_tasks(self, instance_id: str) -> list[t.Trajectory]:
        return [decode_trajectory(f[b"task"]) for _, f in
                await self.r.xrange(keys.inbox(instance_id))]

    async def published(self, job_id: str) -> list[tuple[t.Trajectory, str, int]]:
        return [(decode_trajectory(f[b"data"]), f[b"status"].decode(),
                 int(f[b"total_tokens"]))
                for _, f in await self.r.xrange(keys.trajectories(job_id))]

    async def counters(self, job_id: str) -> dict[str, int]:
        raw = await self.r.hgetall(keys.counters(job_id))
        return {k.decode(): int(v) for k, v in raw.items() if int(v)}

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None:
        raw = await self.r.hget(keys.tasks(job_id), trajectory_id)
        return decode_trajectory(raw) if raw is not None else None

    async def assignment(self, job_id: str, trajectory_id: str) -> str | None:
        raw = await self.r.hget(keys.assignments(job_id), trajectory_id)
        return raw.decode() if raw is not None else None

    async def load(self, job_id: str) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in
                (await self.r.hgetall(keys.load(job_id))).items()}

    async def events(self, job_id: str, kind: str) -> list[dict[str, str]]:
        return [{k.decode(): v.decode() for k, v in f.items()}
                for _, f in await self.r.xrange(keys.events(job_id))
                if f[b"kind"] == kind.encode()]

    async def weights_in_use(self, job_id: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in
                (await self.r.hgetall(keys.weights_in_use(job_id))).items()}


class MemoryWorld:
    def __init__(self) -> None:
        self.store = MemoryRolloutStore()

    def __getattr__(self, name: str) -> Any:
        """The memory store's own seeding and reading methods, awaitable like Redis's."""
        method = getattr(self.store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)
        return call

    async def inbox_tasks(self, instance_id: str) -> list[t.Trajectory]:
        return [traj for _, traj in self.store.inbox_tasks(instance_id)]

    async def published(self, job_id: str) -> list[tuple[t.Trajectory, str, int]]:
        return [(e.trajectory, e.status, e.total_tokens) for e in self.store.published(job_id)]

    async def drop_inbox(self, instance_id: str) -> None:
        self.store.drop_inbox(instance_id)
