"""Fake coordinator client (``libra.clients.coordinator.CoordinatorApi``).

Replaces: the coordinator service behind gRPC (worker registry and job API). Everything
else is real. Leases are granted with increasing epochs; ``lose_lease_times`` makes
``renew_lease`` raise ``LeaseLost``; step records and job ends are recorded.
``unavailable_times`` makes that many step/job-done reports raise ``Unavailable`` (the
coordinator restarting); ``lose_reply_times`` makes that many reports be applied and
then raise ``Unavailable`` (the reply was lost); ``acquire_unavailable_times`` does the
same to lease acquisitions, ``renew_unavailable_times`` to renewals; ``release_error``
makes lease releases raise it. With ``expire_leases`` a lease runs out ``ttl_ms`` after
its last grant or renewal, by the event loop's clock, as Redis expires it: a renewal
after that raises ``LeaseLost`` (counted in ``num_expired``). Step
records are keyed by their idempotency key, as the coordinator keys them: a repeat is
counted, not stored (a redone step, under a new key, is stored again); job ends are
all recorded. Given a
(bytes-mode) ``redis`` client, the lease hash is mirrored there as the real coordinator
writes it (role, bucket, epoch), so fenced writes (the rollout's publish) see it; given
``mirror_lease`` (e.g. ``MemoryRolloutStore.set_lease``), it is called the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from libra import redis_keys as keys
from libra import types as t
from libra.errors import LeaseLost, Unavailable
from libra.wire.step_record import step_record_to_dict


@dataclass
class FakeCoordinator:
    epoch: int = 0
    lose_lease_times: int = 0
    # The TTL granted when set (a coordinator scaling TTLs with the fleet); else the asked.
    grant_ttl_ms: int | None = None
    acquired: list[str] = field(default_factory=list)
    renewed: list[tuple[str, int]] = field(default_factory=list)
    released: list[tuple[str, int]] = field(default_factory=list)
    steps: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    done: list[tuple[str, t.JobState, str]] = field(default_factory=list)
    role_changes: list[tuple[str, t.WorkerRole]] = field(default_factory=list)
    redis: Any = None
    mirror_lease: Any = None  # (worker_id, lease or None) -> None
    unavailable_times: int = 0
    acquire_unavailable_times: int = 0
    release_error: Exception | None = None
    renew_unavailable_times: int = 0
    expire_leases: bool = False
    num_expired: int = 0
    _expires_at_s: float = float("inf")
    lose_reply_times: int = 0
    num_unavailable: int = 0
    step_keys: dict[tuple[str, int], str] = field(default_factory=dict)
    num_repeats: int = 0

    def _outage(self) -> None:
        if self.unavailable_times:
            self.unavailable_times -= 1
            self.num_unavailable += 1
            raise Unavailable("coordinator restarting")

    def _lost_reply(self) -> None:
        if self.lose_reply_times:
            self.lose_reply_times -= 1
            self.num_unavailable += 1
            raise Unavailable("reply lost")

    async def _mirror(self, lease: t.Lease | None, worker_id: str) -> None:
        if self.mirror_lease is not None:
            self.mirror_lease(worker_id, lease)
        if self.redis is None:
            return
        if lease is None:
            await self.redis.delete(keys.lease(worker_id))
            return
        await self.redis.sadd(keys.WORKERS, worker_id)
        await self.redis.hset(keys.lease(worker_id), mapping={
            "role": lease.role.value, "bucket": lease.bucket, "epoch": lease.epoch})

    def _lease(self, worker_id: str, role: t.WorkerRole, bucket: str, address: str,
               ttl_ms: int) -> t.Lease:
        return t.Lease(t.WorkerId(worker_id), role, bucket, address, self.epoch, 0,
                       ttl_ms if self.grant_ttl_ms is None else self.grant_ttl_ms)

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        if self.acquire_unavailable_times:
            self.acquire_unavailable_times -= 1
            raise Unavailable("coordinator restarting")
        self.epoch += 1
        self.acquired.append(worker_id)
        self._last = (role, bucket, address, ttl_ms)
        lease = self._lease(worker_id, role, bucket, address, ttl_ms)
        self._granted(lease)
        await self._mirror(lease, worker_id)
        return lease

    def _granted(self, lease: t.Lease) -> None:
        if self.expire_leases:
            self._expires_at_s = asyncio.get_running_loop().time() + lease.ttl_ms / 1000

    async def renew_lease(self, worker_id: str, epoch: int, *,
                          timeout_s: float | None = None) -> t.Lease:
        self.renewed.append((worker_id, epoch))
        if self.renew_unavailable_times:
            self.renew_unavailable_times -= 1
            raise Unavailable("coordinator restarting")
        if self.expire_leases and asyncio.get_running_loop().time() > self._expires_at_s:
            self.num_expired += 1
            self.lose_lease_times = max(self.lose_lease_times, 1)
        if self.lose_lease_times:
            self.lose_lease_times -= 1
            await self._mirror(None, worker_id)
            raise LeaseLost(f"lease of {worker_id} expired")
        lease = self._lease(worker_id, *self._last)
        self._granted(lease)
        await self._mirror(lease, worker_id)
        return lease

    async def renew_leases(self, refs: Sequence[t.LeaseRef]) -> list[t.LeaseRenewal]:
        out = []
        for ref in refs:
            try:
                lease = await self.renew_lease(ref.worker_id, ref.epoch)
            except LeaseLost:
                out.append(t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.GONE))
            else:
                out.append(t.LeaseRenewal(ref.worker_id, ref.epoch, t.RenewOutcome.RENEWED,
                                          lease))
        return out

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        self.released.append((worker_id, epoch))
        if self.release_error is not None:
            raise self.release_error
        if epoch == self.epoch:
            await self._mirror(None, worker_id)

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set on the epoch, like the coordinator: a fresh epoch on success."""
        if expected_epoch != self.epoch:
            raise LeaseLost(f"lease of {worker_id} is at epoch {self.epoch}, "
                            f"not {expected_epoch}")
        self.epoch += 1
        self.role_changes.append((worker_id, role))
        self._last = (role, *self._last[1:])
        lease = self._lease(worker_id, *self._last)
        await self._mirror(lease, worker_id)
        return lease

    async def list_workers(self) -> list[t.Lease]:
        return []

    async def report_step(self, job_id: str, record: t.StepRecord | dict[str, Any],
                          idempotency_key: str = "") -> None:
        """Keeps the record as the coordinator would store it (its JSON object)."""
        self._outage()
        if not isinstance(record, dict):
            record = step_record_to_dict(record)
        slot = (job_id, int(record["step"]))
        key = idempotency_key or f"{job_id}:{slot[1]}"
        if self.step_keys.get(slot) == key:
            self.num_repeats += 1
        else:
            self.step_keys[slot] = key
            self.steps.append((job_id, dict(record)))
        self._lost_reply()

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        self._outage()
        self.done.append((job_id, state, message))
        self._lost_reply()
