"""Trainer state in Redis: the trajectory stream (consumer group), idempotency set,
counters and the policy pointer. The only module of the trainer that imports redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from libra import redis_keys as keys
from libra import types as t
from libra.redis_shared import JobRecordReader, ensure_consumer_group
from libra.wire.common import decode_trajectory
from services.trainer.store_protocol import TrainerStore as TrainerStore

logger = logging.getLogger(__name__)
R = TypeVar("R")
# A supervised Redis killed and restarted from its AOF is back in about a second; the
# trainer waits this long (backoff doubling from 0.05 s, capped at 1 s) before its job
# fails. Fits well inside the coordinator's trainer_lost_s.
REDIS_OUTAGE_S = 30.0

# KEYS[1] stream, KEYS[2] trained-ids set, KEYS[3] counters hash.
# ARGV: group, n_entries, entry ids..., n_ids, trajectory ids..., then (name, delta) pairs.
# Acks the entries; unless the first trajectory id is already in the set (this very
# call ran before and only its reply was lost: a retry after a Redis restart), adds the
# ids and bumps the counters. Returns 1 if applied, 0 if it was a repeat.
_CONSUME_LUA = """
local group = ARGV[1]
local n_entries = tonumber(ARGV[2])
for i = 1, n_entries do redis.call('XACK', KEYS[1], group, ARGV[2 + i]) end
local at = 3 + n_entries
local n_ids = tonumber(ARGV[at])
if n_ids > 0 and redis.call('SISMEMBER', KEYS[2], ARGV[at + 1]) == 1 then return 0 end
for i = 1, n_ids do redis.call('SADD', KEYS[2], ARGV[at + i]) end
local i = at + n_ids + 1
while i < #ARGV do
  redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
return 1
"""


class RedisTrainerStore(JobRecordReader):
    """``TrainerStore`` over a bytes-mode ``redis.asyncio`` client."""

    def __init__(self, redis: Any, outage_s: float = REDIS_OUTAGE_S) -> None:
        from redis import exceptions as redis_errors  # the redis adapter's own import

        self._r = redis
        self._outage_s = outage_s
        self._transient = (redis_errors.ConnectionError, redis_errors.TimeoutError)
        self._consume = redis.register_script(_CONSUME_LUA)
        # Set when a read's outcome was lost: the next read takes the consumer's pending
        # entries, so entries delivered by a read whose reply never came are not stranded
        # (the core acks the ones it already holds as duplicates).
        self._reread_pending = False

    async def _retrying(self, what: str, call: Callable[[], Awaitable[R]]) -> R:
        """``call()`` again with backoff while Redis is unreachable (killed, restarting).

        Every call routed here is safe to repeat after an unknown outcome: reads, sets,
        acks, and ``consume`` (a repeat is recognised by its first id). One warning per
        outage, one when it is over; gives up (raises) after ``outage_s``.
        """
        loop = asyncio.get_running_loop()
        delay_s, started_s, failures = 0.05, loop.time(), 0
        while True:
            try:
                result = await call()
            except self._transient as exc:
                failures += 1
                if loop.time() - started_s >= self._outage_s:
                    raise
                if failures == 1:
                    logger.warning("[redis] %s failed error=%s; retrying with backoff",
                                   what, exc)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)
                continue
            if failures:
                logger.warning("[redis] %s succeeded after %d failed tries", what, failures)
            return result

    async def job_field(self, job_id: str, name: str) -> str | None:
        return await self._retrying("job_field", lambda: super(
            RedisTrainerStore, self).job_field(job_id, name))

    async def job_run_dir(self, job_id: str) -> str:
        run_dir = await self.job_field(job_id, "run_dir")
        if not run_dir:
            raise RuntimeError(f"job {job_id} has no run_dir")
        return run_dir

    async def ensure_group(self, job_id: str) -> None:
        await self._retrying("ensure_group", lambda: ensure_consumer_group(
            self._r, keys.trajectories(job_id), keys.TRAINER_GROUP))

    async def read(self, job_id: str, consumer: str, count: int, block_ms: int,
                   pending: bool = False) -> list[tuple[str, t.Trajectory]]:
        """New entries, or (``pending=True``) the ones delivered before a restart."""
        return await self._retrying("read", lambda: self._read(job_id, consumer, count,
                                                               block_ms, pending))

    async def _read(self, job_id: str, consumer: str, count: int, block_ms: int,
                    pending: bool) -> list[tuple[str, t.Trajectory]]:
        pending, self._reread_pending = pending or self._reread_pending, True
        stream = keys.trajectories(job_id)
        # Pending: all of them at once (a second read from "0" would repeat the first
        # ``count``, so a capped read would strand the rest).
        reply = await self._r.xreadgroup(keys.TRAINER_GROUP, consumer,
                                         {stream: "0" if pending else ">"},
                                         count=None if pending else count,
                                         block=None if pending else block_ms)
        self._reread_pending = False
        out = []
        for _stream, items in reply or []:
            for entry_id, fields in items:
                if fields:  # a pending entry whose data was trimmed has no fields
                    out.append((entry_id.decode(), decode_trajectory(fields[b"data"])))
        return out

    async def already_consumed(self, job_id: str, traj_ids: list[str]) -> list[bool]:
        if not traj_ids:
            return []
        found = await self._retrying("already_consumed", lambda: self._r.smismember(
            keys.trained_ids(job_id), traj_ids))
        return [bool(x) for x in found]

    async def consume(self, job_id: str, entry_ids: list[str], traj_ids: list[str],
                      **counters: int) -> None:
        """Ack entries, remember their ids and bump counters, atomically (one script).

        A repeat after a lost reply changes nothing when ``traj_ids`` is non-empty; a
        counters-only call (``dropped_groups``, eval counts) could count twice then.
        """
        bumps = [x for name, delta in counters.items() if delta for x in (name, delta)]
        args = [keys.TRAINER_GROUP, len(entry_ids), *entry_ids, len(traj_ids), *traj_ids,
                *bumps]
        script_keys = [keys.trajectories(job_id), keys.trained_ids(job_id),
                       keys.counters(job_id)]
        await self._retrying("consume", lambda: self._consume(keys=script_keys, args=args))

    async def publish_policy(self, job_id: str, info: t.PolicyInfo) -> None:
        mapping = {"version": info.version, "weights_path": info.weights_path,
                   "sha256": info.sha256, "model_dir": info.model_dir,
                   "published_at_ms": info.published_at_ms}
        await self._retrying("publish_policy", lambda: self._r.hset(keys.policy(job_id),
                                                                    mapping=mapping))

    async def counters(self, job_id: str) -> dict[str, int]:
        """The job's cumulative counters (scheduler placements and migrations included)."""
        raw = await self._retrying("counters", lambda: self._r.hgetall(keys.counters(job_id)))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def running_jobs(self) -> list[str]:
        """Jobs in state ``running``, oldest first."""
        ids = [j.decode() for j in await self._r.zrange(keys.JOBS_INDEX, 0, -1)]
        states = [await self._r.hget(keys.job(j), "state") for j in ids]
        return [j for j, state in zip(ids, states, strict=True) if state == b"running"]

    async def policy_version(self, job_id: str) -> int:
        """The version the policy pointer announces (-1 when none was published)."""
        raw = await self._retrying("policy_version", lambda: self._r.hget(
            keys.policy(job_id), "version"))
        return int(raw) if raw is not None else -1

    async def record_event(self, job_id: str, kind: str, **fields: str) -> None:
        # A repeat after a lost reply may record the event twice (harmless: a log).
        await self._retrying("record_event", lambda: self._r.xadd(
            keys.events(job_id), {"kind": kind, **fields}, maxlen=keys.EVENTS_MAXLEN,
            approximate=True))

    async def weights_in_use(self, job_id: str) -> set[int]:
        """Versions live rollout instances hold or fetch (``keys.weights_in_use``).

        An instance counts while its lease key exists: a dead one's lease expires (its
        TTL), and so its versions stop being protected."""
        raw = await self._retrying("weights_in_use", lambda: self._r.hgetall(
            keys.weights_in_use(job_id)))
        if not raw:
            return set()
        instances = [k.decode() for k in raw]
        live = await self._retrying("weights_in_use", lambda: self._leases_exist(instances))
        versions: set[int] = set()
        for instance, is_live in zip(instances, live, strict=True):
            if is_live:
                versions.update(int(v) for v in raw[instance.encode()].split())
        versions.discard(-1)
        return versions

    async def _leases_exist(self, instances: list[str]) -> list[Any]:
        async with self._r.pipeline(transaction=False) as pipe:
            for instance in instances:
                pipe.exists(keys.lease(instance))
            return await pipe.execute()
