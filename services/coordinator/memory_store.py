"""The coordinator store in process memory: the same contract as the Redis store (same
methods, errors and fencing), with leases expiring by an injected clock. Pure (no redis):
unit tests and the in-process loop use it."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from libra import types as t
from libra.clock import Clock
from libra.errors import NotFound
from services.coordinator.store_protocol import (
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


class InMemoryCoordinatorStore(RenewsOneAsABatch):
    """The same contract in process memory, with a clock for expiry (unit tests)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._jobs: dict[str, t.Job] = {}
        self._steps: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._leases: dict[str, t.Lease] = {}
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._fence = 0
        self._queue: dict[str, float] = {}  # job_id -> queue score
        self._queue_seq = 0

    async def put_job(self, job: t.Job) -> None:
        self._jobs[job.job_id] = job

    async def get_job(self, job_id: str) -> t.Job:
        if job_id not in self._jobs:
            raise NotFound(f"job {job_id!r} not found")
        return self._jobs[job_id]

    async def list_jobs(self) -> list[t.Job]:
        return sorted(self._jobs.values(), key=lambda j: j.created_at_ms)

    async def list_job_summaries(self) -> list[t.Job]:
        return [dataclasses.replace(job, spec_json="") for job in await self.list_jobs()]

    async def enqueue_job(self, job: t.Job) -> None:
        self._queue_seq += 1
        self._jobs[job.job_id] = job
        self._queue[job.job_id] = queue_score(job.priority, self._queue_seq)

    async def dequeue_job(self, job_id: str) -> bool:
        return self._queue.pop(job_id, None) is not None

    async def queued_job_ids(self) -> list[str]:
        return sorted(self._queue, key=self._queue.__getitem__)

    async def delete_job(self, job_id: str) -> None:
        self._queue.pop(job_id, None)
        self._jobs.pop(job_id, None)
        self._steps.pop(job_id, None)
        self._counters.pop(job_id, None)
        self._events.pop(job_id, None)

    async def append_step(self, job_id: str, record: dict[str, Any],
                          idempotency_key: str = "") -> StepAppend:
        step = step_of(record)
        key = idempotency_key or default_step_key(job_id, step)
        held = self._steps.setdefault(job_id, {})
        if step in held and held[step][0] == key:
            return StepAppend.REPEAT
        outcome = StepAppend.REPLACED if step in held else StepAppend.STORED
        held[step] = (key, dict(record))
        return outcome

    async def steps(self, job_id: str) -> list[dict[str, Any]]:
        held = self._steps.get(job_id, {})
        return [dict(held[step][1]) for step in sorted(held)]

    async def counters(self, job_id: str) -> dict[str, int]:
        return dict(self._counters.get(job_id, {}))

    async def backlog(self, job_id: str) -> dict[str, int]:
        return {}  # no queues in memory: the report falls back to the difference

    async def accounting(self, job_id: str) -> dict[str, int]:
        return {**await self.counters(job_id), **await self.backlog(job_id)}

    def _live(self, worker_id: str) -> t.Lease | None:
        lease = self._leases.get(worker_id)
        if lease is None or lease.expires_at_ms <= self._clock.now_ms():
            return None
        return lease

    def _ttl_floor_ms(self, ttl_ms_per_worker: int, worker_id: str, num_joining: int) -> int:
        # The workers holding a live lease, this one counted (the Redis store counts the
        # workers set, which an expired worker leaves when leases are next listed).
        others = sum(1 for w in self._leases if w != worker_id and self._live(w) is not None)
        return lease_ttl_floor_ms(ttl_ms_per_worker, others + 1 + num_joining)

    async def acquire_lease(self, lease: t.Lease, ttl_ms_per_worker: int = 0,
                            num_joining: int = 0) -> t.Lease:
        self._fence += 1
        ttl_ms = max(lease.ttl_ms, self._ttl_floor_ms(ttl_ms_per_worker, lease.worker_id,
                                                      num_joining))
        granted = t.Lease(lease.worker_id, lease.role, lease.bucket, lease.address,
                          self._fence, self._clock.now_ms() + ttl_ms, ttl_ms)
        self._leases[lease.worker_id] = granted
        return granted

    async def renew_leases(self, refs: Sequence[t.LeaseRef], now_ms: int,
                           ttl_ms_per_worker: int = 0,
                           num_joining: int = 0) -> list[t.LeaseRenewal]:
        return [self._renew(ref, now_ms, ttl_ms_per_worker, num_joining) for ref in refs]

    def _renew(self, ref: t.LeaseRef, now_ms: int, ttl_ms_per_worker: int,
               num_joining: int) -> t.LeaseRenewal:
        lease = self._live(ref.worker_id)
        if lease is None:
            return t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.GONE)
        if lease.epoch != ref.epoch:
            return t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.FENCED)
        ttl_ms = max(lease.ttl_ms, self._ttl_floor_ms(ttl_ms_per_worker, ref.worker_id,
                                                      num_joining))
        renewed = t.Lease(lease.worker_id, lease.role, lease.bucket, lease.address,
                          lease.epoch, now_ms + ttl_ms, ttl_ms)
        self._leases[ref.worker_id] = renewed
        return t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.RENEWED, renewed)

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        lease = self._leases.get(worker_id)
        if lease is not None and lease.epoch == epoch:
            del self._leases[worker_id]

    async def live_leases(self) -> list[t.Lease]:
        return [lease for w in sorted(self._leases) if (lease := self._live(w)) is not None]

    async def change_role(self, worker_id: str, expected_epoch: int, role: t.WorkerRole,
                          allowed_from: Collection[t.WorkerRole] = ()) -> t.Lease:
        lease = self._live(worker_id)
        if lease is None:
            raise lease_lost_gone(worker_id)
        if lease.epoch != expected_epoch:
            raise lease_lost_epoch(worker_id, lease.epoch, expected_epoch)
        if allowed_from and lease.role not in allowed_from:
            raise role_refused(worker_id, lease.role.value, role, allowed_from)
        self._fence += 1
        changed = t.Lease(lease.worker_id, role, lease.bucket, lease.address, self._fence,
                          lease.expires_at_ms, lease.ttl_ms)
        self._leases[worker_id] = changed
        return changed

    async def record_event(self, job_id: str, event: dict[str, Any]) -> None:
        self._events.setdefault(job_id, []).append(dict(event))

    async def events(self, job_id: str) -> list[dict[str, Any]]:
        return [dict(e) for e in self._events.get(job_id, [])]
