"""Scheduler state in Redis: job specs, live instances, load counters, assignments.

The only module of the scheduler that imports redis. A placement is one MULTI
transaction (task kept for re-placement, assignment, inbox entry, load +1) so a crash
between steps cannot leave a trajectory counted but not queued.
"""

from __future__ import annotations

from typing import Any, Protocol

from libra import redis_keys as keys
from libra import types as t
from libra.wire.common import decode_trajectory, encode_trajectory


class SchedulerStore(Protocol):
    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def job_state(self, job_id: str) -> str | None: ...

    async def live_instances(self, job_id: str) -> list[t.InstanceLoad]: ...

    async def counters(self, job_id: str) -> dict[str, int]: ...

    async def incr_counters(self, job_id: str, **deltas: int) -> None: ...

    async def running_jobs(self) -> list[str]: ...

    async def admit(self, job_id: str, trajs: list[t.Trajectory]) -> None: ...

    async def pending(self, job_id: str) -> list[t.Trajectory]: ...

    async def requeue(self, job_id: str, traj: t.Trajectory) -> None: ...

    async def place(self, job_id: str, traj: t.Trajectory, instance_id: str) -> None: ...

    async def apply_load(self, job_id: str, deltas: tuple[tuple[str, int], ...]) -> None: ...

    async def finish(self, job_id: str, trajectory_id: str) -> str | None: ...

    async def assignments(self, job_id: str) -> dict[str, str]: ...

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None: ...

    async def forget_instance(self, job_id: str, instance_id: str) -> None: ...

    async def has_policy(self, job_id: str) -> bool: ...


class RedisSchedulerStore:
    """``SchedulerStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis

    async def job_spec_json(self, job_id: str) -> str | None:
        raw = await self._r.hget(keys.job(job_id), "spec_json")
        return raw.decode() if raw else None

    async def job_state(self, job_id: str) -> str | None:
        raw = await self._r.hget(keys.job(job_id), "state")
        return raw.decode() if raw else None

    async def has_policy(self, job_id: str) -> bool:
        return bool(await self._r.hexists(keys.policy(job_id), "version"))

    async def live_instances(self, job_id: str) -> list[t.InstanceLoad]:
        worker_ids = sorted(w.decode() for w in await self._r.smembers(keys.WORKERS))
        async with self._r.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hmget(keys.lease(worker_id), "role", "bucket")
            pipe.hgetall(keys.load(job_id))
            *leases, load = await pipe.execute()
        active = {k.decode(): int(v) for k, v in load.items()}
        out = []
        for worker_id, (role, bucket) in zip(worker_ids, leases, strict=True):
            if role is not None and role.decode() == t.WorkerRole.CORE_ROLLOUT.value:
                out.append(
                    t.InstanceLoad(
                        t.InstanceId(worker_id), bucket.decode(), active.get(worker_id, 0)
                    )
                )
        return out

    async def counters(self, job_id: str) -> dict[str, int]:
        raw = await self._r.hgetall(keys.counters(job_id))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def incr_counters(self, job_id: str, **deltas: int) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            for name, delta in deltas.items():
                pipe.hincrby(keys.counters(job_id), name, delta)
            await pipe.execute()

    async def running_jobs(self) -> list[str]:
        ids = [j.decode() for j in await self._r.zrange(keys.JOBS_INDEX, 0, -1)]
        states = [await self.job_state(j) for j in ids]
        return [j for j, state in zip(ids, states, strict=True) if state == "running"]

    async def admit(self, job_id: str, trajs: list[t.Trajectory]) -> None:
        """Queue one group's trajectories and count the group, atomically."""
        async with self._r.pipeline(transaction=True) as pipe:
            for traj in trajs:
                pipe.hset(keys.pending(job_id), traj.trajectory_id, encode_trajectory(traj))
            pipe.hincrby(keys.counters(job_id), "admitted_groups", 1)
            pipe.hincrby(keys.counters(job_id), "admitted", len(trajs))
            await pipe.execute()

    async def pending(self, job_id: str) -> list[t.Trajectory]:
        raw = await self._r.hgetall(keys.pending(job_id))
        return [decode_trajectory(v) for _k, v in sorted(raw.items())]

    async def requeue(self, job_id: str, traj: t.Trajectory) -> None:
        """Move a trajectory from its (dead) instance back to the pending queue."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.tasks(job_id), traj.trajectory_id)
            pipe.hdel(keys.assignments(job_id), traj.trajectory_id)
            pipe.hset(keys.pending(job_id), traj.trajectory_id, encode_trajectory(traj))
            pipe.hincrby(keys.counters(job_id), "requeued", 1)
            await pipe.execute()

    async def place(self, job_id: str, traj: t.Trajectory, instance_id: str) -> None:
        data = encode_trajectory(traj)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.pending(job_id), traj.trajectory_id)
            pipe.hset(keys.tasks(job_id), traj.trajectory_id, data)
            pipe.hset(keys.assignments(job_id), traj.trajectory_id, instance_id)
            pipe.xadd(keys.inbox(instance_id), {"job_id": job_id, "task": data})
            pipe.hincrby(keys.load(job_id), instance_id, 1)
            await pipe.execute()

    async def apply_load(self, job_id: str, deltas: tuple[tuple[str, int], ...]) -> None:
        if not deltas:
            return
        async with self._r.pipeline(transaction=True) as pipe:
            for instance_id, delta in deltas:
                pipe.hincrby(keys.load(job_id), instance_id, delta)
            await pipe.execute()

    async def finish(self, job_id: str, trajectory_id: str) -> str | None:
        """Forget a trajectory's task and assignment; returns the instance it was on."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hget(keys.assignments(job_id), trajectory_id)
            pipe.hdel(keys.tasks(job_id), trajectory_id)
            pipe.hdel(keys.assignments(job_id), trajectory_id)
            instance, _, _ = await pipe.execute()
        return instance.decode() if instance else None

    async def assignments(self, job_id: str) -> dict[str, str]:
        raw = await self._r.hgetall(keys.assignments(job_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None:
        raw = await self._r.hget(keys.tasks(job_id), trajectory_id)
        return decode_trajectory(raw) if raw else None

    async def forget_instance(self, job_id: str, instance_id: str) -> None:
        # Its inbox held what it was running; those tasks are re-placed from `tasks`.
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(keys.inbox(instance_id))
            pipe.hdel(keys.load(job_id), instance_id)
            await pipe.execute()
