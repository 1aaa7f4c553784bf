"""Rollout state in Redis: the instance's inbox, job specs, policy pointer, results.

The only module of the rollout service that imports redis. Publishing a finished
trajectory is one MULTI: append to the job's trajectory stream, acknowledge the inbox
entry, count it - so a crash can re-deliver (pending entry) but never lose it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from libra import redis_keys as keys
from libra import types as t
from libra.redis_shared import JobRecordReader, ensure_consumer_group
from libra.wire.common import decode_trajectory, encode_trajectory


@dataclass(frozen=True)
class InboxEntry:
    entry_id: str
    job_id: str
    trajectory: t.Trajectory


class RolloutStore(Protocol):
    async def ensure_inbox(self, instance_id: str) -> None: ...

    async def read_inbox(self, instance_id: str, count: int,
                         block_ms: int) -> list[InboxEntry]: ...

    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def job_state(self, job_id: str) -> str | None: ...

    async def policy(self, job_id: str) -> t.PolicyInfo | None: ...

    async def publish(self, traj: t.Trajectory, instance_id: str, entry_id: str) -> None: ...

    async def handoff(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      target_instance: str) -> None: ...

    async def ack(self, instance_id: str, entry_id: str) -> None: ...

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None: ...


class RedisRolloutStore(JobRecordReader):
    """``RolloutStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis

    async def ensure_inbox(self, instance_id: str) -> None:
        await ensure_consumer_group(self._r, keys.inbox(instance_id), keys.ROLLOUT_GROUP)

    async def read_inbox(self, instance_id: str, count: int,
                         block_ms: int) -> list[InboxEntry]:
        stream = keys.inbox(instance_id)
        try:
            reply = await self._r.xreadgroup(keys.ROLLOUT_GROUP, instance_id, {stream: ">"},
                                             count=count, block=block_ms or None)
        except Exception as exc:  # NOGROUP: the scheduler deleted the inbox; recreate
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_inbox(instance_id)
            return []
        entries = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
                entries.append(InboxEntry(entry_id.decode(), fields[b"job_id"].decode(),
                                          decode_trajectory(fields[b"task"])))
        return entries

    async def policy(self, job_id: str) -> t.PolicyInfo | None:
        raw = await self._r.hgetall(keys.policy(job_id))
        if not raw:
            return None
        h = {k.decode(): v.decode() for k, v in raw.items()}
        return t.PolicyInfo(int(h["version"]), h["weights_path"], h["sha256"], h["model_dir"],
                            int(h.get("published_at_ms", 0)))

    async def publish(self, traj: t.Trajectory, instance_id: str, entry_id: str) -> None:
        failed = traj.status is t.TrajectoryStatus.FAILED
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.xadd(keys.trajectories(traj.job_id), {"trajectory_id": traj.trajectory_id,
                                                       "data": encode_trajectory(traj)})
            pipe.xack(keys.inbox(instance_id), keys.ROLLOUT_GROUP, entry_id)
            pipe.xdel(keys.inbox(instance_id), entry_id)  # the inbox only holds live work
            pipe.hincrby(keys.counters(traj.job_id), "failed" if failed else "produced", 1)
            await pipe.execute()

    async def handoff(self, traj: t.Trajectory, instance_id: str, entry_id: str,
                      target_instance: str) -> None:
        data = encode_trajectory(traj)
        async with self._r.pipeline(transaction=True) as pipe:
            # Keep the latest state for re-placement should the target die too.
            pipe.hset(keys.tasks(traj.job_id), traj.trajectory_id, data)
            pipe.xadd(keys.inbox(target_instance), {"job_id": traj.job_id, "task": data})
            pipe.xack(keys.inbox(instance_id), keys.ROLLOUT_GROUP, entry_id)
            pipe.xdel(keys.inbox(instance_id), entry_id)
            await pipe.execute()

    async def ack(self, instance_id: str, entry_id: str) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.xack(keys.inbox(instance_id), keys.ROLLOUT_GROUP, entry_id)
            pipe.xdel(keys.inbox(instance_id), entry_id)
            await pipe.execute()

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None:
        await self._r.xadd(keys.events(job_id), {"kind": kind, **fields},
                           maxlen=keys.EVENTS_MAXLEN, approximate=True)
