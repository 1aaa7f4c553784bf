"""The rig for the elastic executor and loop tests: a real ``InMemoryCoordinatorStore``
with leased workers, ``FakeRollout`` in place of the rollout instances' gRPC clients (it
performs the role changes a real instance would, through the store, and can be told to
fail or never answer) and ``FakeClock`` in place of wall time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import ElasticSpec
from services.coordinator.core import ROLE_MOVES
from services.coordinator.elastic import ElasticExecutor, Signal
from services.coordinator.memory_store import InMemoryCoordinatorStore

JOB = "job-e"
ROLLOUT, HYBRID = t.WorkerRole.CORE_ROLLOUT, t.WorkerRole.HYBRID_ROLLOUT


@dataclass
class LendReplyStub:
    lease: t.Lease
    num_handed_back: int = 2


@dataclass
class FakeRollout:
    """One rollout instance: lend moves its lease to hybrid-joining, reclaim back."""

    worker_id: str
    store: InMemoryCoordinatorStore
    lend_error: Exception | None = None
    lend_hangs: bool = False
    calls: list[tuple[str, int]] = field(default_factory=list)

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendReplyStub:
        self.calls.append(("lend", generation))
        if self.lend_hangs:
            await asyncio.Event().wait()
        if self.lend_error is not None:
            raise self.lend_error
        lease = await self.store.change_role(self.worker_id, expected_epoch,
                                             t.WorkerRole.HYBRID_JOINING,
                                             ROLE_MOVES[t.WorkerRole.HYBRID_JOINING])
        return LendReplyStub(lease)

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease:
        self.calls.append(("reclaim", generation))
        lease = await self.lease()
        if lease.role is HYBRID:
            return lease
        return await self.store.change_role(self.worker_id, lease.epoch, HYBRID)

    async def activate(self) -> None:
        lease = await self.lease()
        await self.store.change_role(self.worker_id, lease.epoch,
                                     t.WorkerRole.HYBRID_TRAINING)

    async def lease(self) -> t.Lease:
        return next(x for x in await self.store.live_leases() if x.worker_id == self.worker_id)


class Rig:
    """A store with leased workers, their fake rollouts and an executor over them."""

    def __init__(self, roles: dict[str, t.WorkerRole], **spec: Any) -> None:
        self.clock = FakeClock()
        self.store = InMemoryCoordinatorStore(self.clock)
        self.roles = roles
        self.rollouts = {w: FakeRollout(w, self.store) for w in roles}
        self.spec = ElasticSpec(enabled=True, **spec)
        self.executor = ElasticExecutor(
            job_id=JOB, spec=self.spec, rollouts=lambda address: self.rollouts[address],
            events=self.store, clock=self.clock, trainer_address="trainer:1",
            rpc_deadline_s=0.05)

    async def start(self) -> Rig:
        for worker_id, role in self.roles.items():
            await self.store.acquire_lease(t.Lease(t.WorkerId(worker_id), role, "short",
                                                   worker_id, 0, 0, 600_000))
        return self

    async def reconcile(self, step: int) -> None:
        await self.executor.reconcile(step, await self.store.live_leases())

    async def roles_now(self) -> dict[str, str]:
        return {x.worker_id: x.role.value for x in await self.store.live_leases()}

    async def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events = await self.store.events(JOB)
        return [e for e in events if kind is None or e["kind"] == kind]


def join(desired: int, ttl_step: int = 100) -> Signal:
    return Signal("join", desired, 0, "train-bound", ttl_step)


def release(desired: int = 0, ttl_step: int = 100) -> Signal:
    return Signal("release", desired, 0, "rollout-bound", ttl_step)


async def make(roles: dict[str, t.WorkerRole], **spec: Any) -> Rig:
    return await Rig(roles, **spec).start()
