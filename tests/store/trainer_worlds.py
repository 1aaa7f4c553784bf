"""What the rest of the stack writes for the trainer store, for both implementations: the
Redis one (real redis-server, the coordinator's and rollout's keys) and the in-memory one
(its writer methods). The contract suite and the trainer's unit rigs seed through these."""

from __future__ import annotations

import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import encode_trajectory
from services.trainer.memory_store import MemoryTrainerStore
from services.trainer.store import RedisTrainerStore


class RedisWorld:
    """Writes the keys the coordinator and rollout services write."""

    def __init__(self, r: aioredis.Redis) -> None:
        self.r = r
        self.store = RedisTrainerStore(r)

    async def put_job(self, job_id: str, spec_json: str, run_dir: str,
                      state: str = "running", created_at_ms: int = 0) -> None:
        await self.r.hset(keys.job(job_id), mapping={"spec_json": spec_json, "state": state,
                                                     "run_dir": run_dir})
        await self.r.zadd(keys.JOBS_INDEX, {job_id: created_at_ms})

    async def set_job_state(self, job_id: str, state: str) -> None:
        await self.r.hset(keys.job(job_id), "state", state)

    async def append(self, job_id: str, traj: t.Trajectory) -> str:
        entry_id = await self.r.xadd(keys.trajectories(job_id), {
            "trajectory_id": traj.trajectory_id, "data": encode_trajectory(traj)})
        return entry_id.decode()

    async def add_counters(self, job_id: str, **deltas: int) -> None:
        for name, delta in deltas.items():
            await self.r.hincrby(keys.counters(job_id), name, delta)

    async def set_weights_in_use(self, job_id: str, instance: str, loaded: int,
                                 loading: int = -1) -> None:
        await self.r.hset(keys.weights_in_use(job_id), instance, f"{loaded} {loading}")

    async def set_lease_live(self, instance: str, live: bool = True) -> None:
        if live:
            await self.r.hset(keys.lease(instance), mapping={"epoch": 1})
        else:
            await self.r.delete(keys.lease(instance))

    async def events(self, job_id: str) -> list[dict[str, str]]:
        return [{k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in await self.r.xrange(keys.events(job_id))]

    async def policy(self, job_id: str) -> dict[str, str]:
        raw = await self.r.hgetall(keys.policy(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def num_pending(self, job_id: str) -> int:
        if not await self.r.exists(keys.trajectories(job_id)) or not any(
                g["name"] == keys.TRAINER_GROUP.encode()
                for g in await self.r.xinfo_groups(keys.trajectories(job_id))):
            return 0  # the trainer has not created its group yet
        return (await self.r.xpending(keys.trajectories(job_id), keys.TRAINER_GROUP))["pending"]


class MemoryWorld:
    """The same writes on a :class:`MemoryTrainerStore` (async, like RedisWorld)."""

    def __init__(self) -> None:
        self.store = MemoryTrainerStore()

    async def put_job(self, job_id: str, spec_json: str, run_dir: str,
                      state: str = "running", created_at_ms: int = 0) -> None:
        self.store.put_job(job_id, spec_json, run_dir, state, created_at_ms)

    async def set_job_state(self, job_id: str, state: str) -> None:
        self.store.set_job_state(job_id, state)

    async def append(self, job_id: str, traj: t.Trajectory) -> str:
        return await self.store.append(job_id, traj)

    async def add_counters(self, job_id: str, **deltas: int) -> None:
        self.store.add_counters(job_id, **deltas)

    async def set_weights_in_use(self, job_id: str, instance: str, loaded: int,
                                 loading: int = -1) -> None:
        self.store.set_weights_in_use(job_id, instance, loaded, loading)

    async def set_lease_live(self, instance: str, live: bool = True) -> None:
        self.store.set_lease_live(instance, live)

    async def events(self, job_id: str) -> list[dict[str, str]]:
        return self.store.events(job_id)

    async def policy(self, job_id: str) -> dict[str, str]:
        info = self.store.policy(job_id)
        if info is None:
            return {}
        return {"version": str(info.version), "weights_path": info.weights_path,
                "sha256": info.sha256, "model_dir": info.model_dir,
                "published_at_ms": str(info.published_at_ms)}

    async def num_pending(self, job_id: str) -> int:
        return self.store.num_pending(job_id)


World = RedisWorld | MemoryWorld
