"""The two rollout stores under one contract: each world pairs a store with what the
other services write and read around it (the scheduler's placements, the coordinator's
lease record, the trainer's policy pointer), through Redis or in memory. Used by the
store contract suite (both worlds) and by the rollout core's rig (tests/unit/rollout:
the memory world; tests/store/test_rollout_weights_in_use.py: the Redis world)."""

from __future__ import annotations

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory, encode_trajectory
from services.rollout.memory_store import MemoryRolloutStore, PublishedEntry
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

    async def set_job_state(self, job_id: str, state: str) -> None:
        await self.r.hset(keys.job(job_id), "state", state)

    async def set_lease_epoch(self, worker_id: str, epoch: int) -> None:
        await self.r.hset(keys.lease(worker_id), mapping={"role": "core-rollout",
                                                          "epoch": epoch})

    async def delete_lease(self, worker_id: str) -> None:
        await self.r.delete(keys.lease(worker_id))

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

    async def inbox_pending(self, instance_id: str) -> int:
        return (await self.r.xpending(keys.inbox(instance_id), keys.ROLLOUT_GROUP))["pending"]

    async def inbox_tasks(self, instance_id: str) -> list[tuple[str, t.Trajectory]]:
        return [(f[b"job_id"].decode(), decode_trajectory(f[b"task"])) for _, f in
                await self.r.xrange(keys.inbox(instance_id))]

    async def published(self, job_id: str) -> list[PublishedEntry]:
        return [PublishedEntry(decode_trajectory(f[b"data"]), int(f[b"total_tokens"]),
                               f[b"status"].decode(), f[b"instance_id"].decode())
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
    """The memory store's own seeding and reading methods, awaitable like Redis's."""

    def __init__(self) -> None:
        self.store = MemoryRolloutStore()

    async def put_job(self, job_id: str, spec_json: str, state: str) -> None:
        self.store.put_job(job_id, spec_json, state)

    async def set_job_state(self, job_id: str, state: str) -> None:
        self.store.set_job_state(job_id, state)

    async def set_policy(self, job_id: str, policy: t.PolicyInfo) -> None:
        self.store.set_policy(job_id, policy)

    async def set_lease_epoch(self, worker_id: str, epoch: int) -> None:
        self.store.set_lease_epoch(worker_id, epoch)

    async def delete_lease(self, worker_id: str) -> None:
        self.store.set_lease(worker_id, None)

    async def place(self, traj: t.Trajectory, instance_id: str, assign: bool = True) -> None:
        self.store.place(traj, instance_id, assign)

    async def drop_inbox(self, instance_id: str) -> None:
        self.store.drop_inbox(instance_id)

    async def inbox_size(self, instance_id: str) -> int:
        return self.store.inbox_size(instance_id)

    async def inbox_pending(self, instance_id: str) -> int:
        return self.store.inbox_pending(instance_id)

    async def inbox_tasks(self, instance_id: str) -> list[tuple[str, t.Trajectory]]:
        return self.store.inbox_tasks(instance_id)

    async def published(self, job_id: str) -> list[PublishedEntry]:
        return self.store.published(job_id)

    async def counters(self, job_id: str) -> dict[str, int]:
        return self.store.counters(job_id)

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None:
        return self.store.task(job_id, trajectory_id)

    async def assignment(self, job_id: str, trajectory_id: str) -> str | None:
        return self.store.assignment(job_id, trajectory_id)

    async def load(self, job_id: str) -> dict[str, int]:
        return self.store.load(job_id)

    async def events(self, job_id: str, kind: str) -> list[dict[str, str]]:
        return self.store.events(job_id, kind)

    async def weights_in_use(self, job_id: str) -> dict[str, str]:
        return self.store.weights_in_use(job_id)
