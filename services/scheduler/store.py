"""Scheduler state in Redis: job specs, live instances, load counters, assignments, and
the placement policy's own state (``RedisPolicyStore``).

The only module of the scheduler that talks to redis. A placement is one MULTI
transaction (task kept for re-placement, assignment, inbox entry, load +1) so a crash
between steps cannot leave a trajectory counted but not queued. Round trips are batched:
a tick reads the job's status, counters and new finishes in one pipeline; the placements
of a tick (with the admission of a group) are one MULTI; the finishes of a tick are
released by one Lua call. Moves are not written here: the rollout instance commits a
move (assignment, load, counters) when it hands the trajectory off.

Finishes come from the job's trajectory stream (the one the trainer consumes), read
through the scheduler's own consumer group (``keys.SCHEDULER_GROUP``): a rollout
instance makes no call per finished trajectory, and a crash of either side between
publish and release cannot leak a slot (unacknowledged entries are read again).
"""

from __future__ import annotations

import collections
from typing import Any, Protocol

from libra import redis_keys as keys
from libra import types as t
from libra.redis_shared import JobRecordReader, ensure_consumer_group
from libra.wire.common import decode_trajectory, encode_trajectory
from services.scheduler.policy.store import PolicyStore
from services.scheduler.policy_store import RedisPolicyStore
from services.scheduler.state import FinishRecord, LeaseSnapshot, TickState

__all__ = ["RedisPolicyStore", "RedisSchedulerStore", "SchedulerStore"]

# Lease roles whose instances receive placements; an instance lent to training
# (hybrid-joining / hybrid-training) keeps its lease but gets nothing new.
ROLLOUT_ROLES = frozenset({t.WorkerRole.CORE_ROLLOUT.value, t.WorkerRole.HYBRID_ROLLOUT.value})


class FlushablePolicyStore(PolicyStore, Protocol):
    """A ``PolicyStore`` whose writes reach durable storage only on ``flush``."""

    async def flush(self) -> None:
        """Write every change made since the last flush."""
        ...


class SchedulerStore(Protocol):
    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def job_state(self, job_id: str) -> str | None: ...

    async def live_instances(self, job_id: str) -> list[t.InstanceLoad]: ...

    async def lease_snapshot(self, job_id: str) -> LeaseSnapshot: ...

    async def counters(self, job_id: str) -> dict[str, int]: ...

    async def incr_counters(self, job_id: str, **deltas: int) -> None: ...

    async def running_jobs(self) -> list[str]: ...

    async def admit(self, job_id: str, trajs: list[t.Trajectory],
                    placed: list[t.Trajectory] | None = None, num_groups: int = 1) -> None: ...

    async def pending(self, job_id: str) -> list[t.Trajectory]: ...

    async def requeue(self, job_id: str, traj: t.Trajectory) -> None: ...

    async def place(self, job_id: str, traj: t.Trajectory, instance_id: str) -> None: ...

    async def place_many(self, job_id: str, trajs: list[t.Trajectory]) -> None: ...

    async def apply_load(self, job_id: str, deltas: tuple[tuple[str, int], ...]) -> None: ...

    async def finish(self, job_id: str, trajectory_id: str) -> str | None: ...

    async def release(self, job_id: str, trajectory_id: str) -> str | None: ...

    async def ensure_finish_group(self, job_id: str) -> None: ...

    async def tick_state(self, job_id: str, finish_cursor: str,
                         max_finishes: int) -> TickState: ...

    async def release_finished(self, job_id: str,
                               finishes: list[FinishRecord]) -> list[str | None]: ...

    async def assignments(self, job_id: str) -> dict[str, str]: ...

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None: ...

    async def forget_instance(self, job_id: str, instance_id: str) -> None: ...

    async def has_policy(self, job_id: str) -> bool: ...

    async def job_step(self, job_id: str) -> int: ...

    async def job_status(self, job_id: str) -> tuple[str | None, int, bool]: ...

    async def open_policy_store(self, job_id: str) -> FlushablePolicyStore: ...


# KEYS[1] = assignments hash, KEYS[2] = tasks hash, KEYS[3] = load hash
# ARGV[1] = trajectory id
# Returns the instance the trajectory was assigned to (its load is decremented), or nil.
_RELEASE_LUA = """
local instance = redis.call('HGET', KEYS[1], ARGV[1])
if not instance then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[3], instance, -1)
return instance
"""

# KEYS[1] = assignments hash, KEYS[2] = tasks hash, KEYS[3] = load hash,
# KEYS[4] = trajectory stream; ARGV[1] = consumer group, then n trajectory ids, then
# their n stream entry ids. Releases each assigned trajectory as _RELEASE_LUA does and
# acknowledges every entry. Returns per trajectory its instance, or '' when unassigned.
_RELEASE_FINISHED_LUA = """
local n = (#ARGV - 1) / 2
local out = {}
for i = 1, n do
  local traj = ARGV[1 + i]
  local instance = redis.call('HGET', KEYS[1], traj)
  if instance then
    redis.call('HDEL', KEYS[1], traj)
    redis.call('HDEL', KEYS[2], traj)
    redis.call('HINCRBY', KEYS[3], instance, -1)
    out[i] = instance
  else
    out[i] = ''
  end
end
if n > 0 then
  redis.call('XACK', KEYS[4], ARGV[1], unpack(ARGV, 2 + n, 1 + 2 * n))
end
return out
"""


class RedisSchedulerStore(JobRecordReader):
    """``SchedulerStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis
        self._release = redis.register_script(_RELEASE_LUA)
        self._release_finished = redis.register_script(_RELEASE_FINISHED_LUA)

    async def has_policy(self, job_id: str) -> bool:
        return bool(await self._r.hexists(keys.policy(job_id), "version"))

    async def job_step(self, job_id: str) -> int:
        """The last training step the coordinator recorded for the job (0 before any)."""
        raw = await self._r.hget(keys.job(job_id), "step")
        return int(raw) if raw else 0

    async def job_status(self, job_id: str) -> tuple[str | None, int, bool]:
        """(state, last step, weights published?) in one round trip."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.job(job_id), "state", "step")
            pipe.hexists(keys.policy(job_id), "version")
            (state, step), published = await pipe.execute()
        return (state.decode() if state else None, int(step) if step else 0, bool(published))

    async def tick_state(self, job_id: str, finish_cursor: str,
                         max_finishes: int) -> TickState:
        """State, step, published?, counters and up to ``max_finishes`` finishes in one
        round trip. ``finish_cursor`` is ``0`` (what was delivered but not acknowledged:
        after a restart) or ``>`` (new entries)."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.job(job_id), "state", "step")
            pipe.hexists(keys.policy(job_id), "version")
            pipe.hgetall(keys.counters(job_id))
            pipe.xreadgroup(keys.SCHEDULER_GROUP, keys.SCHEDULER_GROUP,
                            {keys.trajectories(job_id): finish_cursor}, count=max_finishes)
            (state, step), published, counters, reply = await pipe.execute(
                raise_on_error=False)
        if isinstance(reply, Exception):
            if "NOGROUP" not in str(reply):
                raise reply
            await self.ensure_finish_group(job_id)  # the stream was deleted meanwhile
            reply = []
        return TickState(state.decode() if state else None, int(step) if step else 0,
                         bool(published), {k.decode(): int(v) for k, v in counters.items()},
                         _finish_records(reply))

    async def ensure_finish_group(self, job_id: str) -> None:
        """The scheduler's consumer group on the job's trajectory stream, from its start."""
        await ensure_consumer_group(self._r, keys.trajectories(job_id), keys.SCHEDULER_GROUP)

    async def release_finished(self, job_id: str,
                               finishes: list[FinishRecord]) -> list[str | None]:
        """Give back the slots of finished trajectories and acknowledge their stream
        entries, atomically, in one round trip. Per finish: the instance it was assigned
        to, or None (re-queued meanwhile, or read twice)."""
        if not finishes:
            return []
        out = await self._release_finished(
            keys=[keys.assignments(job_id), keys.tasks(job_id), keys.load(job_id),
                  keys.trajectories(job_id)],
            args=[keys.SCHEDULER_GROUP, *(f.trajectory_id for f in finishes),
                  *(f.entry_id for f in finishes)])
        return [v.decode() if v else None for v in out]

    async def open_policy_store(self, job_id: str) -> RedisPolicyStore:
        """The job's policy state, loaded from Redis (empty for a new job)."""
        store = RedisPolicyStore(self._r, job_id)
        await store.load()
        return store

    async def live_instances(self, job_id: str) -> list[t.InstanceLoad]:
        return (await self.lease_snapshot(job_id)).instances

    async def lease_snapshot(self, job_id: str) -> LeaseSnapshot:
        """Every live lease's epoch, and the rollout-role instances with the job's load
        (no load is read for ``job_id`` ``""``: epochs are all the caller needs)."""
        worker_ids = sorted(w.decode() for w in await self._r.smembers(keys.WORKERS))
        async with self._r.pipeline(transaction=False) as pipe:
            for worker_id in worker_ids:
                pipe.hmget(keys.lease(worker_id), "role", "bucket", "epoch")
            if job_id:
                pipe.hgetall(keys.load(job_id))
            replies = await pipe.execute()
        leases, load = (replies[:-1], replies[-1]) if job_id else (replies, {})
        active = {k.decode(): int(v) for k, v in load.items()}
        instances, epochs = [], {}
        for worker_id, (role, bucket, epoch) in zip(worker_ids, leases, strict=True):
            if role is None:
                continue  # the lease expired: the worker is gone
            epochs[worker_id] = int(epoch) if epoch else 0
            if role.decode() in ROLLOUT_ROLES:
                instances.append(t.InstanceLoad(t.InstanceId(worker_id),
                                                (bucket or b"").decode(),
                                                active.get(worker_id, 0)))
        return LeaseSnapshot(instances, epochs)

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

    async def admit(self, job_id: str, trajs: list[t.Trajectory],
                    placed: list[t.Trajectory] | None = None, num_groups: int = 1) -> None:
        """Count ``num_groups`` groups and queue ``trajs``, atomically; ``placed``
        members (``instance_id`` set) are placed in the same transaction instead."""
        placed = placed or []
        async with self._r.pipeline(transaction=True) as pipe:
            if trajs:
                pipe.hset(keys.pending(job_id), mapping={
                    traj.trajectory_id: encode_trajectory(traj) for traj in trajs})
            _place_commands(pipe, job_id, placed)
            pipe.hincrby(keys.counters(job_id), "admitted_groups", num_groups)
            pipe.hincrby(keys.counters(job_id), "admitted", len(trajs) + len(placed))
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
        traj.instance_id = instance_id
        await self.place_many(job_id, [traj])

    async def place_many(self, job_id: str, trajs: list[t.Trajectory]) -> None:
        """Place trajectories (``instance_id`` set) in one MULTI: each leaves the pending
        queue and gets its task, assignment, inbox entry, load +1 and placement count."""
        if not trajs:
            return
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hdel(keys.pending(job_id), *(traj.trajectory_id for traj in trajs))
            _place_commands(pipe, job_id, trajs)
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

    async def release(self, job_id: str, trajectory_id: str) -> str | None:
        """A finished trajectory gives its slot back: forget it and decrement the load of
        the instance it is assigned to, in one atomic step; None if it was not assigned
        (re-queued meanwhile, or reported twice)."""
        instance = await self._release(
            keys=[keys.assignments(job_id), keys.tasks(job_id), keys.load(job_id)],
            args=[trajectory_id])
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


def _place_commands(pipe: Any, job_id: str, trajs: list[t.Trajectory]) -> None:
    """Queue the placement of ``trajs`` (``instance_id`` set): one command per hash and
    per counter for all of them, one inbox entry each."""
    if not trajs:
        return
    data = {traj.trajectory_id: encode_trajectory(traj) for traj in trajs}
    pipe.hset(keys.tasks(job_id), mapping=data)
    pipe.hset(keys.assignments(job_id),
              mapping={traj.trajectory_id: traj.instance_id for traj in trajs})
    for traj in trajs:
        pipe.xadd(keys.inbox(traj.instance_id),
                  {"job_id": job_id, "task": data[traj.trajectory_id]})
    for instance_id, count in collections.Counter(tr.instance_id for tr in trajs).items():
        pipe.hincrby(keys.load(job_id), instance_id, count)
    for bucket, count in collections.Counter(tr.bucket for tr in trajs).items():
        pipe.hincrby(keys.counters(job_id), keys.placed_counter(bucket), count)


def _finish_records(reply: Any) -> list[FinishRecord]:
    """Stream entries as finish records. The rollout writes ``total_tokens`` and
    ``status`` beside the trajectory; an entry without them is decoded whole."""
    out = []
    for _stream, items in reply or []:
        for entry_id, fields in items:
            if not fields:  # deleted after delivery: nothing to learn; still acknowledged
                out.append(FinishRecord(_text(entry_id), "", 0, t.TrajectoryStatus.FAILED))
            elif b"total_tokens" in fields and b"status" in fields:
                out.append(FinishRecord(_text(entry_id), _text(fields[b"trajectory_id"]),
                                        int(fields[b"total_tokens"]),
                                        t.TrajectoryStatus(_text(fields[b"status"]))))
            else:
                traj = decode_trajectory(fields[b"data"])
                out.append(FinishRecord(_text(entry_id), traj.trajectory_id,
                                        traj.num_generated_tokens, traj.status))
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
