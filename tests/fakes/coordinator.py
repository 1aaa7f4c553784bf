"""Fake coordinator client (``libra.clients.coordinator.CoordinatorApi``).

Replaces: the coordinator service behind gRPC (worker registry and job API). Everything
else is real. Leases are granted with increasing epochs; ``lose_lease_times`` makes
``renew_lease`` raise ``LeaseLost``; step records and job ends are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from libra import types as t
from libra.errors import LeaseLost


@dataclass
class FakeCoordinator:
    epoch: int = 0
    lose_lease_times: int = 0
    acquired: list[str] = field(default_factory=list)
    renewed: list[tuple[str, int]] = field(default_factory=list)
    released: list[tuple[str, int]] = field(default_factory=list)
    steps: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    done: list[tuple[str, t.JobState, str]] = field(default_factory=list)

    def _lease(self, worker_id: str, role: t.WorkerRole, bucket: str, address: str,
               ttl_ms: int) -> t.Lease:
        return t.Lease(t.WorkerId(worker_id), role, bucket, address, self.epoch, 0, ttl_ms)

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        self.epoch += 1
        self.acquired.append(worker_id)
        self._last = (role, bucket, address, ttl_ms)
        return self._lease(worker_id, role, bucket, address, ttl_ms)

    async def renew_lease(self, worker_id: str, epoch: int) -> t.Lease:
        self.renewed.append((worker_id, epoch))
        if self.lose_lease_times:
            self.lose_lease_times -= 1
            raise LeaseLost(f"lease of {worker_id} expired")
        return self._lease(worker_id, *self._last)

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        self.released.append((worker_id, epoch))

    async def report_step(self, job_id: str, record: dict[str, Any]) -> None:
        self.steps.append((job_id, dict(record)))

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> None:
        self.done.append((job_id, state, message))
