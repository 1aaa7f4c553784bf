"""Coordinator state in Redis: jobs, step history, worker leases, the job queue, events.

``RedisCoordinatorStore`` is the production adapter of the port in ``store_protocol.py``
(the only module of this service that imports redis); ``memory_store.py`` holds the
in-memory one. One contract suite runs against both. The port's names are re-exported
here, where the service and its tests have always imported them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from libra import redis_keys as keys
from libra import types as t
from libra.clock import Clock
from libra.errors import NotFound, register_unavailable
from libra.redis_fields import LEASE_EPOCH, lease_from_hash, lease_to_hash
from services.coordinator.memory_store import InMemoryCoordinatorStore
from services.coordinator.store_protocol import (
    MAX_LEASE_TTL_MS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    QUEUE_SEQ_SPAN,
    CoordinatorStore,
    RenewsOneAsABatch,
    StepAppend,
    default_step_key,
    lease_lost_epoch,
    lease_lost_gone,
    lease_ttl_floor_ms,
    queue_score,
    role_refused,
    step_of,
)
from services.coordinator.store_scripts import (
    ACCOUNTING_LUA,
    ACQUIRE_LUA,
    APPEND_STEP_LUA,
    CHANGE_ROLE_LUA,
    PRUNE_WORKER_LUA,
    RELEASE_LUA,
    RENEW_LUA,
)

__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "QUEUE_SEQ_SPAN", "CoordinatorStore",
           "InMemoryCoordinatorStore", "RedisCoordinatorStore", "StepAppend",
           "default_step_key", "queue_score", "step_of"]

logger = logging.getLogger(__name__)
R = TypeVar("R")

# Lease-path calls retry on connection errors: 5 tries, backoff 0.1 s doubling to 0.8 s
# (1.5 s of waiting in all), so a Redis blip of about a second is ridden out.
RETRY_ATTEMPTS = 5
RETRY_FIRST_DELAY_S = 0.1


def _event_from_entry(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """An events-stream entry as a dict: ours carry JSON under ``event``; other services
    write flat string fields, timed by the entry id."""
    if "event" in fields:
        return json.loads(fields["event"])
    return {"ts_ms": int(entry_id.split("-")[0]), **fields}


def _job_to_hash(job: t.Job) -> dict[str, str]:
    return {"job_id": job.job_id, "name": job.name, "state": job.state.value,
            "spec_json": job.spec_json, "created_at_ms": str(job.created_at_ms),
            "updated_at_ms": str(job.updated_at_ms), "message": job.message,
            "step": str(job.step), "policy_version": str(job.policy_version),
            "run_dir": job.run_dir, "priority": str(job.priority),
            "num_resumes": str(job.num_resumes)}


# Every field of a job's hash but its spec: what a ListJobs summary holds.
_SUMMARY_FIELDS = ("job_id", "name", "state", "created_at_ms", "updated_at_ms", "message",
                   "step", "policy_version", "run_dir", "priority", "num_resumes")


def _job_from_hash(h: dict[str, str]) -> t.Job:
    return t.Job(job_id=t.JobId(h["job_id"]), name=h["name"], state=t.JobState(h["state"]),
                 spec_json=h["spec_json"], created_at_ms=int(h["created_at_ms"]),
                 updated_at_ms=int(h["updated_at_ms"]), message=h.get("message", ""),
                 step=int(h.get("step", 0)), policy_version=int(h.get("policy_version", 0)),
                 run_dir=h.get("run_dir", ""), priority=int(h.get("priority", 0)),
                 num_resumes=int(h.get("num_resumes", 0)))


def renewal_from_reply(ref: t.LeaseRef, reply: list[Any], now_ms: int) -> t.LeaseRenewal:
    """One lease's answer from ``RENEW_LUA``'s reply for it."""
    code = int(reply[0])
    if code == -1:
        return t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.GONE)
    if code == -2:
        return t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.FENCED)
    flat = reply[1]
    lease = lease_from_hash(dict(zip(flat[::2], flat[1::2], strict=True)), code, now_ms)
    return t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.RENEWED, lease)


class RedisCoordinatorStore(RenewsOneAsABatch):
    """Jobs, history and leases in Redis (keys from ``libra.redis_keys``)."""

    def __init__(self, redis: Any, clock: Clock, retry_attempts: int = RETRY_ATTEMPTS,
                 retry_first_delay_s: float = RETRY_FIRST_DELAY_S) -> None:
        from redis import exceptions as redis_errors  # the redis adapter's own import

        self._r = redis
        self._clock = clock
        self._retry_attempts = retry_attempts
        self._retry_first_delay_s = retry_first_delay_s
        self._transient = (redis_errors.ConnectionError, redis_errors.TimeoutError)
        register_unavailable(*self._transient)  # the API answers UNAVAILABLE / 503 for them
        self._acquire = redis.register_script(ACQUIRE_LUA)
        self._renew = redis.register_script(RENEW_LUA)
        self._release = redis.register_script(RELEASE_LUA)
        self._change_role = redis.register_script(CHANGE_ROLE_LUA)
        self._append_step = redis.register_script(APPEND_STEP_LUA)
        self._prune_worker = redis.register_script(PRUNE_WORKER_LUA)
        self._accounting = redis.register_script(ACCOUNTING_LUA)

    async def _retrying(self, what: str, call: Callable[[], Awaitable[R]]) -> R:
        """Run ``call`` again with exponential backoff while Redis is unreachable.

        Only for calls that are safe to repeat after an unknown outcome: reads, job
        writes, renew and release (idempotent), acquire (a repeat grants a newer epoch, which wins),
        and role changes (compare-and-set with a per-call token, never applied twice).
        """
        delay_s = self._retry_first_delay_s
        for attempt in range(1, self._retry_attempts + 1):
            try:
                return await call()
            except self._transient as exc:
                if attempt == self._retry_attempts:
                    raise
                logger.warning("[redis] %s failed attempt=%d error=%s; retrying in %.2fs",
                               what, attempt, exc, delay_s)
                await asyncio.sleep(delay_s)
                delay_s *= 2
        raise AssertionError("unreachable")

    async def put_job(self, job: t.Job) -> None:
        await self._retrying("put_job", lambda: self._write_job(job))

    async def _write_job(self, job: t.Job, queue_score_: float | None = None) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hset(keys.job(job.job_id), mapping=_job_to_hash(job))
            pipe.zadd(keys.JOBS_INDEX, {job.job_id: job.created_at_ms})
            # A job that ended keeps its keys for FINISHED_JOB_TTL_MS; one resumed (no
            # longer terminal) keeps them for good again.
            for key in keys.job_keys(job.job_id):
                if job.state.is_terminal:
                    pipe.pexpire(key, keys.FINISHED_JOB_TTL_MS)
                else:
                    pipe.persist(key)
            if queue_score_ is not None:
                pipe.zadd(keys.JOB_QUEUE, {job.job_id: queue_score_})
            await pipe.execute()

    async def enqueue_job(self, job: t.Job) -> None:
        # A lost reply to INCR only skips a number: the order of the queue holds.
        seq = await self._retrying("enqueue_job", lambda: self._r.incr(keys.JOB_QUEUE_SEQ))
        score = queue_score(job.priority, int(seq))
        await self._retrying("enqueue_job", lambda: self._write_job(job, score))

    async def dequeue_job(self, job_id: str) -> bool:
        return bool(await self._retrying("dequeue_job",
                                         lambda: self._r.zrem(keys.JOB_QUEUE, job_id)))

    async def queued_job_ids(self) -> list[str]:
        return list(await self._retrying("queued_job_ids",
                                         lambda: self._r.zrange(keys.JOB_QUEUE, 0, -1)))

    async def get_job(self, job_id: str) -> t.Job:
        h = await self._retrying("get_job", lambda: self._r.hgetall(keys.job(job_id)))
        if not h:
            raise NotFound(f"job {job_id!r} not found")
        return _job_from_hash(h)

    async def list_jobs(self) -> list[t.Job]:
        ids = await self._r.zrange(keys.JOBS_INDEX, 0, -1)
        async with self._r.pipeline(transaction=False) as pipe:  # one round trip
            for job_id in ids:
                pipe.hgetall(keys.job(job_id))
            hashes = await pipe.execute()
        jobs = []
        for job_id, h in zip(ids, hashes, strict=True):
            if h:
                jobs.append(_job_from_hash(h))
            else:  # expired: keep the index tidy
                await self._r.zrem(keys.JOBS_INDEX, job_id)
        return jobs

    async def list_job_summaries(self) -> list[t.Job]:
        ids = await self._r.zrange(keys.JOBS_INDEX, 0, -1)
        async with self._r.pipeline(transaction=False) as pipe:  # one round trip, no specs
            for job_id in ids:
                pipe.hmget(keys.job(job_id), _SUMMARY_FIELDS)
            rows = await pipe.execute()
        return [_job_from_hash({**dict(zip(_SUMMARY_FIELDS, row, strict=True)),
                                "spec_json": ""})
                for row in rows if row[0] is not None]  # an expired job has no job_id

    async def delete_job(self, job_id: str) -> None:
        await self._r.delete(*keys.job_keys(job_id))
        await self._r.zrem(keys.JOBS_INDEX, job_id)
        await self._r.zrem(keys.JOB_QUEUE, job_id)

    async def append_step(self, job_id: str, record: dict[str, Any],
                          idempotency_key: str = "") -> StepAppend:
        step = step_of(record)
        key = idempotency_key or default_step_key(job_id, step)
        # Safe to retry: a repeat after an unknown outcome finds its own key (REPEAT).
        code = await self._retrying("append_step", lambda: self._append_step(
            keys=[keys.history(job_id), keys.step_index(job_id)],
            args=[step, key, json.dumps(record), keys.HISTORY_MAXLEN]))
        return (StepAppend.STORED, StepAppend.REPEAT, StepAppend.REPLACED)[int(code)]

    async def steps(self, job_id: str) -> list[dict[str, Any]]:
        entries = await self._retrying("steps", lambda: self._r.xrange(keys.history(job_id)))
        # A replaced step was appended at the end: order by step (stable otherwise).
        return sorted((json.loads(fields["record"]) for _id, fields in entries),
                      key=lambda record: record.get("step", 0))

    async def counters(self, job_id: str) -> dict[str, int]:
        raw = await self._retrying("counters", lambda: self._r.hgetall(keys.counters(job_id)))
        return {k: int(v) for k, v in raw.items()}

    async def backlog(self, job_id: str) -> dict[str, int]:
        return {k: v for k, v in (await self.accounting(job_id)).items()
                if k.startswith("in_flight_")}

    async def accounting(self, job_id: str) -> dict[str, int]:
        raw, unconsumed, running, pending = await self._retrying(
            "accounting", lambda: self._accounting(
                keys=[keys.counters(job_id), keys.trajectories(job_id),
                      keys.assignments(job_id), keys.pending(job_id)],
                args=[keys.TRAINER_GROUP]))
        counters = {k: int(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}
        return {**counters, "in_flight_unconsumed": int(unconsumed),
                "in_flight_running": int(running), "in_flight_pending_admission": int(pending)}

    async def acquire_lease(self, lease: t.Lease, ttl_ms_per_worker: int = 0,
                            num_joining: int = 0) -> t.Lease:
        if ttl_ms_per_worker > 0:
            workers = await self._retrying("acquire_lease",
                                           lambda: self._num_workers_with(lease.worker_id))
            floor_ms = lease_ttl_floor_ms(ttl_ms_per_worker, workers + num_joining)
            lease = dataclasses.replace(lease, ttl_ms=max(lease.ttl_ms, floor_ms))
        fields = lease_to_hash(lease)
        fields.pop(LEASE_EPOCH)  # the grant script sets it from the fence
        flat = [x for kv in fields.items() for x in kv]
        epoch = await self._retrying("acquire_lease", lambda: self._acquire(
            keys=[keys.lease(lease.worker_id), keys.FENCE], args=[lease.ttl_ms, *flat]))
        await self._retrying("acquire_lease", lambda: self._r.sadd(keys.WORKERS,
                                                                   lease.worker_id))
        now_ms = self._clock.now_ms()
        return t.Lease(lease.worker_id, lease.role, lease.bucket, lease.address, int(epoch),
                       now_ms + lease.ttl_ms, lease.ttl_ms)

    async def _num_workers_with(self, worker_id: str) -> int:
        """The workers set's size once ``worker_id`` is in it."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.scard(keys.WORKERS)
            pipe.sismember(keys.WORKERS, worker_id)
            size, member = await pipe.execute()
        return int(size) + (0 if member else 1)

    async def renew_leases(self, refs: Sequence[t.LeaseRef], now_ms: int,
                           ttl_ms_per_worker: int = 0,
                           num_joining: int = 0) -> list[t.LeaseRenewal]:
        if not refs:
            return []
        replies = await self._retrying("renew_leases", lambda: self._renew(
            keys=[keys.WORKERS, *(keys.lease(r.worker_id) for r in refs)],
            args=[ttl_ms_per_worker, MAX_LEASE_TTL_MS, num_joining,
                  *(str(r.epoch) for r in refs)]))
        return [renewal_from_reply(ref, reply, now_ms)
                for ref, reply in zip(refs, replies, strict=True)]

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        await self._retrying("release_lease", lambda: self._release(
            keys=[keys.lease(worker_id)], args=[str(epoch)]))

    async def live_leases(self) -> list[t.Lease]:
        return await self._retrying("live_leases", self._read_live_leases)

    async def _read_live_leases(self) -> list[t.Lease]:
        now_ms = self._clock.now_ms()
        leases = []
        for worker_id in sorted(await self._r.smembers(keys.WORKERS)):
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys.lease(worker_id))
                pipe.pttl(keys.lease(worker_id))
                h, pttl = await pipe.execute()
            if h:
                leases.append(lease_from_hash(h, pttl, now_ms))
            else:  # expired: forget the id, or the set grows with every worker ever seen
                await self._prune_worker(keys=[keys.lease(worker_id), keys.WORKERS],
                                         args=[worker_id])
        return leases

    async def change_role(self, worker_id: str, expected_epoch: int, role: t.WorkerRole,
                          allowed_from: Collection[t.WorkerRole] = ()) -> t.Lease:
        token = uuid.uuid4().hex  # one per call: lets a retry recognise its own change
        args = [str(expected_epoch), role.value, token, *(r.value for r in allowed_from)]
        reply = await self._retrying("change_role", lambda: self._change_role(
            keys=[keys.lease(worker_id), keys.FENCE], args=args))
        code = int(reply[0])
        if code == -1:
            raise lease_lost_gone(worker_id)
        if code == -2:
            raise lease_lost_epoch(worker_id, int(reply[1]), expected_epoch)
        if code == -3:
            raise role_refused(worker_id, str(reply[1]), role, allowed_from)
        flat = reply[2]
        h = dict(zip(flat[::2], flat[1::2], strict=True))
        return lease_from_hash(h, int(reply[1]), self._clock.now_ms())

    async def record_event(self, job_id: str, event: dict[str, Any]) -> None:
        await self._r.xadd(keys.events(job_id), {"kind": str(event.get("kind", "")),
                                                 "event": json.dumps(event)},
                           maxlen=keys.EVENTS_MAXLEN, approximate=True)

    async def events(self, job_id: str) -> list[dict[str, Any]]:
        entries = await self._retrying("events", lambda: self._r.xrange(keys.events(job_id)))
        return [_event_from_entry(entry_id, fields) for entry_id, fields in entries]
