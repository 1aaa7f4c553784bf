"""The placement policy's state in Redis: ``RedisPolicyStore`` (write-behind cache)."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable
from typing import Any

from libra import redis_keys as keys
from libra.redis_shared import ScriptBatch, register_script_batch


class RedisPolicyStore:
    """``PolicyStore`` for one job: an in-memory cache written behind to Redis.

    The policy API is synchronous and sits on the decision path, so it works on process
    memory; the scheduler loop calls ``flush`` at the end of every tick, which writes
    the entries changed since the last flush in one atomic ``ScriptBatch``, together
    with the tick's own writes. ``load`` fills the cache from Redis when a (possibly
    restarted) scheduler starts scheduling the job.

    The cache holds values as JSON text, exactly what Redis holds: a value is encoded
    once on write, a read decodes a fresh copy (never an alias of the policy's objects).

    One scheduler process owns a job's policy state: a second writer would overwrite it.
    A crash loses at most the changes since the last flush (one tick).

    Redis layout (``libra.redis_keys``): per-trajectory records in ``sched_trajectories``,
    namespaced records in ``sched_records``, the recent ring in ``sched_recent`` (a
    capped list) and the tree snapshot in ``sched_tree``.
    """

    def __init__(self, redis: Any, job_id: str) -> None:
        self._r = redis
        self._batch_script = register_script_batch(redis)
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

    async def flush(self, also: Callable[[Any], None] | None = None) -> None:
        """Write the changes made since the last flush (no round trip when there are
        none); ``also`` adds the caller's commands to the same atomic batch (one round
        trip), so a tick's placements and the policy state they go with commit together."""
        async with self._flush_lock:
            if not self.is_dirty and also is None:
                return
            trajectories, records = self._dirty_trajectories, self._dirty_records
            recent, max_len = self._new_recent, self._recent_max_len
            is_tree_dirty = self._is_tree_dirty
            self._init_dirty()
            batch = ScriptBatch(self._batch_script)
            if also is not None:
                also(batch)
            self._write_trajectories(batch, trajectories)
            self._write_records(batch, records)
            if recent:
                batch.rpush(keys.sched_recent(self._job_id), *recent)
                batch.ltrim(keys.sched_recent(self._job_id), -max_len, -1)
            if is_tree_dirty and self._tree is not None:
                batch.set(keys.sched_tree(self._job_id), self._tree)
            await batch.execute()

    @property
    def is_dirty(self) -> bool:
        """Whether some change has not been flushed yet."""
        return bool(self._dirty_trajectories or self._dirty_records or self._new_recent
                    or self._is_tree_dirty)

    def _write_trajectories(self, pipe: Any, trajectory_ids: set[str]) -> None:
        _write_hash(pipe, keys.sched_trajectories(self._job_id),
                    {tid: self._trajectories.get(tid) for tid in trajectory_ids})

    def _write_records(self, pipe: Any, record_keys: set[tuple[str, str]]) -> None:
        _write_hash(pipe, keys.sched_records(self._job_id),
                    {json.dumps([namespace, key]): self._records[namespace].get(key)
                     for namespace, key in record_keys})

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


def _write_hash(pipe: Any, name: str, values: dict[str, str | None]) -> None:
    """Set the fields with a value and delete the others: one command each."""
    updates = {field: value for field, value in values.items() if value is not None}
    deletes = [field for field, value in values.items() if value is None]
    if updates:
        pipe.hset(name, mapping=updates)
    if deletes:
        pipe.hdel(name, *deletes)


def _decode(value: str | None) -> Any:
    return json.loads(value) if value is not None else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
