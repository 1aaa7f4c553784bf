"""Trainer state in Redis: the trajectory stream (consumer group), idempotency set,
counters and the policy pointer. The only module of the trainer that imports redis."""

from __future__ import annotations

from typing import Any, Protocol

from libra import redis_keys as keys
from libra import types as t
from libra.redis_shared import JobRecordReader, ensure_consumer_group
from libra.wire.common import decode_trajectory


class TrainerStore(Protocol):
    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def job_run_dir(self, job_id: str) -> str: ...

    async def ensure_group(self, job_id: str) -> None: ...

    async def read(self, job_id: str, consumer: str, count: int, block_ms: int,
                   pending: bool = False) -> list[tuple[str, t.Trajectory]]: ...

    async def already_consumed(self, job_id: str, traj_ids: list[str]) -> list[bool]: ...

    async def consume(self, job_id: str, entry_ids: list[str], traj_ids: list[str],
                      **counters: int) -> None: ...

    async def publish_policy(self, job_id: str, info: t.PolicyInfo) -> None: ...

    async def counters(self, job_id: str) -> dict[str, int]: ...

    async def running_jobs(self) -> list[str]: ...

    async def policy_version(self, job_id: str) -> int: ...

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None: ...

    async def weights_in_use(self, job_id: str) -> set[int]: ...


class RedisTrainerStore(JobRecordReader):
    """``TrainerStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis

    async def job_run_dir(self, job_id: str) -> str:
        run_dir = await self.job_field(job_id, "run_dir")
        if not run_dir:
            raise RuntimeError(f"job {job_id} has no run_dir")
        return run_dir

    async def ensure_group(self, job_id: str) -> None:
        await ensure_consumer_group(self._r, keys.trajectories(job_id), keys.TRAINER_GROUP)

    async def read(self, job_id: str, consumer: str, count: int, block_ms: int,
                   pending: bool = False) -> list[tuple[str, t.Trajectory]]:
        """New entries, or (``pending=True``) the ones delivered before a restart."""
        stream = keys.trajectories(job_id)
        # Pending: all of them at once (a second read from "0" would repeat the first
        # ``count``, so a capped read would strand the rest).
        reply = await self._r.xreadgroup(keys.TRAINER_GROUP, consumer,
                                         {stream: "0" if pending else ">"},
                                         count=None if pending else count,
                                         block=None if pending else block_ms)
        out = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
                if fields:  # a pending entry whose data was trimmed has no fields
                    out.append((entry_id.decode(), decode_trajectory(fields[b"data"])))
        return out

    async def already_consumed(self, job_id: str, traj_ids: list[str]) -> list[bool]:
        if not traj_ids:
            return []
        return [bool(x) for x in await self._r.smismember(keys.trained_ids(job_id), traj_ids)]

    async def consume(self, job_id: str, entry_ids: list[str], traj_ids: list[str],
                      **counters: int) -> None:
        """Ack entries, remember their ids and bump counters, atomically."""
        async with self._r.pipeline(transaction=True) as pipe:
            if entry_ids:
                pipe.xack(keys.trajectories(job_id), keys.TRAINER_GROUP, *entry_ids)
            if traj_ids:
                pipe.sadd(keys.trained_ids(job_id), *traj_ids)
            for name, delta in counters.items():
                if delta:
                    pipe.hincrby(keys.counters(job_id), name, delta)
            await pipe.execute()

    async def publish_policy(self, job_id: str, info: t.PolicyInfo) -> None:
        await self._r.hset(keys.policy(job_id), mapping={
            "version": info.version, "weights_path": info.weights_path, "sha256": info.sha256,
            "model_dir": info.model_dir, "published_at_ms": info.published_at_ms})

    async def counters(self, job_id: str) -> dict[str, int]:
        """The job's cumulative counters (scheduler placements and migrations included)."""
        raw = await self._r.hgetall(keys.counters(job_id))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def running_jobs(self) -> list[str]:
        """Jobs in state ``running``, oldest first."""
        ids = [j.decode() for j in await self._r.zrange(keys.JOBS_INDEX, 0, -1)]
        states = [await self._r.hget(keys.job(j), "state") for j in ids]
        return [j for j, state in zip(ids, states, strict=True) if state == b"running"]

    async def policy_version(self, job_id: str) -> int:
        """The version the policy pointer announces (-1 when none was published)."""
        raw = await self._r.hget(keys.policy(job_id), "version")
        return int(raw) if raw is not None else -1

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None:
        await self._r.xadd(keys.events(job_id), {"kind": kind, **fields},
                           maxlen=keys.EVENTS_MAXLEN, approximate=True)

    async def weights_in_use(self, job_id: str) -> set[int]:
        """Versions live rollout instances hold or fetch (``keys.weights_in_use``).

        An instance counts while its lease key exists: a dead one's lease expires (its
        TTL), and so its versions stop being protected."""
        raw = await self._r.hgetall(keys.weights_in_use(job_id))
        if not raw:
            return set()
        instances = [k.decode() for k in raw]
        async with self._r.pipeline(transaction=False) as pipe:
            for instance in instances:
                pipe.exists(keys.lease(instance))
            live = await pipe.execute()
        versions: set[int] = set()
        for instance, is_live in zip(instances, live, strict=True):
            if is_live:
                versions.update(int(v) for v in raw[instance.encode()].split())
        versions.discard(-1)
        return versions
