"""Scheduler state in Redis: job specs, live instances, load counters, assignments, and
the placement policy's own state (``RedisPolicyStore``).

The only module of the scheduler that talks to redis. A placement is one MULTI
transaction (task kept for re-placement, assignment, inbox entry, load +1) so a crash
between steps cannot leave a trajectory counted but not queued.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any, Protocol

from libra import redis_keys as keys
from libra import types as t
from libra.redis_shared import JobRecordReader
from libra.wire.common import decode_trajectory, encode_trajectory
from services.scheduler.policy.store import PolicyStore


class FlushablePolicyStore(PolicyStore, Protocol):
    """A ``PolicyStore`` whose writes reach durable storage only on ``flush``."""

    async def flush(self) -> None:
        """Write every change made since the last flush."""
        ...


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

    async def release(self, job_id: str, trajectory_id: str) -> str | None: ...

    async def assignments(self, job_id: str) -> dict[str, str]: ...

    async def task(self, job_id: str, trajectory_id: str) -> t.Trajectory | None: ...

    async def forget_instance(self, job_id: str, instance_id: str) -> None: ...

    async def has_policy(self, job_id: str) -> bool: ...

    async def job_step(self, job_id: str) -> int: ...

    async def job_status(self, job_id: str) -> tuple[str | None, int, bool]: ...

    async def move(self, job_id: str, trajectory_id: str, to_instance: str, to_bucket: str,
                   deltas: tuple[tuple[str, int], ...]) -> None: ...

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


class RedisSchedulerStore(JobRecordReader):
    """``SchedulerStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any) -> None:
        self._r = redis
        self._release = redis.register_script(_RELEASE_LUA)

    async def has_policy(self, job_id: str) -> bool:
        return bool(await self._r.hexists(keys.policy(job_id), "version"))

    async def job_step(self, job_id: str) -> int:
        """The last training step the coordinator recorded for the job (0 before any)."""
        raw = await self._r.hget(keys.job(job_id), "step")
        return int(raw) if raw else 0

    async def job_status(self, job_id: str) -> tuple[str | None, int, bool]:
        """(state, last step, weights published?) in one round trip, once per tick."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.job(job_id), "state", "step")
            pipe.hexists(keys.policy(job_id), "version")
            (state, step), published = await pipe.execute()
        return (state.decode() if state else None, int(step) if step else 0, bool(published))

    async def open_policy_store(self, job_id: str) -> RedisPolicyStore:
        """The job's policy state, loaded from Redis (empty for a new job)."""
        store = RedisPolicyStore(self._r, job_id)
        await store.load()
        return store

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
            pipe.hincrby(keys.counters(job_id), placed_counter(traj.bucket), 1)
            await pipe.execute()

    async def move(self, job_id: str, trajectory_id: str, to_instance: str, to_bucket: str,
                   deltas: tuple[tuple[str, int], ...]) -> None:
        """Re-pin a trajectory (the rollout instance hands it over): load deltas, its
        assignment (so re-queueing follows it), and the migration counters, atomically."""
        async with self._r.pipeline(transaction=True) as pipe:
            for instance_id, delta in deltas:
                pipe.hincrby(keys.load(job_id), instance_id, delta)
            pipe.hset(keys.assignments(job_id), trajectory_id, to_instance)
            pipe.hincrby(keys.counters(job_id), "migrations", 1)
            pipe.hincrby(keys.counters(job_id), placed_counter(to_bucket), 1)
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


def placed_counter(bucket: str) -> str:
    """Counter field of placements into ``bucket`` (moves in included)."""
    return f"placed:{bucket}"


class RedisPolicyStore:
    """``PolicyStore`` for one job: an in-memory cache written behind to Redis.

    The policy API is synchronous and sits on the decision path, so it works on process
    memory; the async scheduler loop calls ``flush`` after every RPC and tick, which
    writes the entries changed since the last flush in one MULTI pipeline. ``load``
    fills the cache from Redis when a (possibly restarted) scheduler starts scheduling
    the job.

    The cache holds values as JSON text, exactly what Redis holds: a value is encoded
    once on write, a read decodes a fresh copy (never an alias of the policy's objects).

    One scheduler process owns a job's policy state: a second writer would overwrite it.
    A crash loses at most the changes since the last flush (one call or tick).

    Redis layout (``libra.redis_keys``): per-trajectory records in ``sched_trajectories``,
    namespaced records in ``sched_records``, the recent ring in ``sched_recent`` (a
    capped list) and the tree snapshot in ``sched_tree``.
    """

    def __init__(self, redis: Any, job_id: str) -> None:
        self._r = redis
        self._job_id = job_id
        self._trajectories: dict[str, str] = {}
        self._records: dict[str, dict[str, str]] = collections.defaultdict(dict)
        self._recent: collections.deque[str] = collections.deque()
        self._tree: str | None = None
        self._init_dirty()
        # Flushes run one at a time and read values at flush time, so a later flush
        # always writes newer state than an earlier one whatever the connection order.
        self._flush_lock = asyncio.Lock()

    def _init_dirty(self) -> None:
        self._dirty_trajectories: set[str] = set()
        self._dirty_records: set[tuple[str, str]] = set()
        self._new_recent: list[str] = []
        self._recent_max_len = 0
        self._is_tree_dirty = False

    # -- persistence ----------------------------------------------------------------------

    async def load(self) -> None:
        """Replace the cache with what Redis holds for the job (drops unflushed changes)."""
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.sched_trajectories(self._job_id))
            pipe.hgetall(keys.sched_records(self._job_id))
            pipe.lrange(keys.sched_recent(self._job_id), 0, -1)
            pipe.get(keys.sched_tree(self._job_id))
            trajectories, records, recent, tree = await pipe.execute()
        self._trajectories = {_text(k): _text(v) for k, v in trajectories.items()}
        self._records = collections.defaultdict(dict)
        for field, value in records.items():
            namespace, key = json.loads(field)
            self._records[namespace][key] = _text(value)
        self._recent = collections.deque(_text(v) for v in recent)
        self._tree = _text(tree) if tree else None
        self._init_dirty()

    async def flush(self) -> None:
        """Write the changes made since the last flush (no round trip when there are none)."""
        async with self._flush_lock:
            if not self.is_dirty:
                return
            trajectories, records = self._dirty_trajectories, self._dirty_records
            recent, max_len = self._new_recent, self._recent_max_len
            is_tree_dirty = self._is_tree_dirty
            self._init_dirty()
            async with self._r.pipeline(transaction=True) as pipe:
                self._write_trajectories(pipe, trajectories)
                self._write_records(pipe, records)
                if recent:
                    pipe.rpush(keys.sched_recent(self._job_id), *recent)
                    pipe.ltrim(keys.sched_recent(self._job_id), -max_len, -1)
                if is_tree_dirty and self._tree is not None:
                    pipe.set(keys.sched_tree(self._job_id), self._tree)
                await pipe.execute()

    @property
    def is_dirty(self) -> bool:
        """Whether some change has not been flushed yet."""
        return bool(self._dirty_trajectories or self._dirty_records or self._new_recent
                    or self._is_tree_dirty)

    def _write_trajectories(self, pipe: Any, trajectory_ids: set[str]) -> None:
        name = keys.sched_trajectories(self._job_id)
        for trajectory_id in trajectory_ids:
            value = self._trajectories.get(trajectory_id)
            if value is None:
                pipe.hdel(name, trajectory_id)
            else:
                pipe.hset(name, trajectory_id, value)

    def _write_records(self, pipe: Any, record_keys: set[tuple[str, str]]) -> None:
        name = keys.sched_records(self._job_id)
        for namespace, key in record_keys:
            field = json.dumps([namespace, key])
            value = self._records[namespace].get(key)
            if value is None:
                pipe.hdel(name, field)
            else:
                pipe.hset(name, field, value)

    # -- PolicyStore (synchronous, on the cache) --------------------------------------------

    def get_trajectory(self, trajectory_id: str) -> dict[str, Any] | None:
        return _decode(self._trajectories.get(trajectory_id))

    def put_trajectory(self, trajectory_id: str, state: dict[str, Any]) -> None:
        self._trajectories[trajectory_id] = json.dumps(state)
        self._dirty_trajectories.add(trajectory_id)

    def delete_trajectory(self, trajectory_id: str) -> None:
        if self._trajectories.pop(trajectory_id, None) is not None:
            self._dirty_trajectories.add(trajectory_id)

    def get_record(self, namespace: str, key: str) -> dict[str, Any] | None:
        return _decode(self._records[namespace].get(key))

    def put_record(self, namespace: str, key: str, value: dict[str, Any]) -> None:
        self._records[namespace][key] = json.dumps(value)
        self._dirty_records.add((namespace, key))

    def delete_record(self, namespace: str, key: str) -> None:
        if self._records[namespace].pop(key, None) is not None:
            self._dirty_records.add((namespace, key))

    def list_records(self, namespace: str) -> dict[str, dict[str, Any]]:
        return {key: json.loads(value) for key, value in self._records[namespace].items()}

    def append_recent(self, record: dict[str, Any], max_len: int) -> None:
        encoded = json.dumps(record)
        self._recent.append(encoded)
        while len(self._recent) > max_len:
            self._recent.popleft()
        self._new_recent.append(encoded)
        del self._new_recent[:-max_len]
        self._recent_max_len = max_len

    def recent(self) -> list[dict[str, Any]]:
        return [json.loads(value) for value in self._recent]

    def load_tree(self) -> dict[str, Any] | None:
        return _decode(self._tree)

    def save_tree(self, snapshot: dict[str, Any]) -> None:
        self._tree = json.dumps(snapshot)
        self._is_tree_dirty = True

    @property
    def num_trajectories(self) -> int:
        """Number of trajectories with state (for tests and reporting)."""
        return len(self._trajectories)


def _decode(value: str | None) -> Any:
    return json.loads(value) if value is not None else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
