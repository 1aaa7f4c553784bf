"""The coordinator store's port: what the pure core needs from its state (jobs, step
history, worker leases, the job queue, events), and the rules every implementation shares
(queue order, step keys, the errors of a lost lease or a refused role change).

Implementations: ``store.RedisCoordinatorStore`` (production) and
``memory_store.InMemoryCoordinatorStore`` (unit tests, the in-process loop); the contract
suite in ``tests/store/test_coordinator_store_contract.py`` runs against both.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from libra import types as t
from libra.errors import FailedPrecondition, LeaseLost

# Queue scores: (MAX_PRIORITY - priority) * QUEUE_SEQ_SPAN + submit sequence, so a higher
# priority sorts first and equal ones keep submit order. Both parts stay exact in a
# double (Redis scores): 2001 * 2**32 < 2**53.
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000
QUEUE_SEQ_SPAN = 2**32


def queue_score(priority: int, seq: int) -> float:
    return float((MAX_PRIORITY - priority) * QUEUE_SEQ_SPAN + seq % QUEUE_SEQ_SPAN)


class StepAppend(enum.Enum):
    """What storing a step report did (step reports are keyed by job + step)."""

    STORED = "stored"
    """The first record of this step."""
    REPEAT = "repeat"
    """The same idempotency key again (a retry after a lost reply): nothing written."""
    REPLACED = "replaced"
    """Another key for a stored step (redone after a trainer resumed): the new record
    replaced the old one."""


def step_of(record: dict[str, Any]) -> int:
    """The record's step number; a report without one cannot be keyed."""
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"a step record needs an integer 'step', got {step!r}")
    return step


def default_step_key(job_id: str, step: int) -> str:
    """The idempotency key of a report that carries none: any repeat is a retry."""
    return f"{job_id}:{step}"


class CoordinatorStore(Protocol):
    async def put_job(self, job: t.Job) -> None: ...

    async def get_job(self, job_id: str) -> t.Job: ...

    async def list_jobs(self) -> list[t.Job]: ...

    async def list_job_summaries(self) -> list[t.Job]:
        """Every job without its spec (``spec_json`` empty): what ListJobs returns, read
        without moving every spec (up to 1 MiB each) out of the store."""
        ...

    async def delete_job(self, job_id: str) -> None: ...

    async def enqueue_job(self, job: t.Job) -> None:
        """Store ``job`` (PENDING) and append it to the queue by its priority, at once."""
        ...

    async def dequeue_job(self, job_id: str) -> bool:
        """Take a job off the queue; False when it was not queued."""
        ...

    async def queued_job_ids(self) -> list[str]:
        """The queue, next job first."""
        ...

    async def append_step(self, job_id: str, record: dict[str, Any],
                          idempotency_key: str = "") -> StepAppend:
        """Store a step record once per key (see ``StepAppend``), atomically."""
        ...

    async def steps(self, job_id: str) -> list[dict[str, Any]]:
        """The job's step records in step order (one per step)."""
        ...

    async def counters(self, job_id: str) -> dict[str, int]: ...

    async def backlog(self, job_id: str) -> dict[str, int]:
        """What is still in flight, measured from the queues themselves (not counted):
        ``in_flight_unconsumed`` (published, not yet acknowledged by the trainer),
        ``in_flight_running`` (assigned to an instance) and
        ``in_flight_pending_admission`` (admitted, not yet placed). Lets the report check
        the accounting identity with an independent term."""
        ...

    async def accounting(self, job_id: str) -> dict[str, int]:
        """``counters`` and ``backlog`` together, from one snapshot: a publish or a
        trainer ack moves a trajectory between a counter and the backlog at once, so two
        separate reads can see it on both sides of the identity (or on neither)."""
        ...

    async def acquire_lease(self, lease: t.Lease, ttl_ms_per_worker: int = 0,
                            num_joining: int = 0) -> t.Lease:
        """Grant ``lease`` at a new epoch. ``ttl_ms_per_worker`` > 0 scales the TTL with
        the fleet (``lease_ttl_floor_ms``): the granted TTL is the larger of the asked one
        and that floor, and the returned lease carries it. ``num_joining``: workers whose
        registration is under way besides the store's fleet; the floor counts them."""
        ...

    async def renew_lease(self, worker_id: str, epoch: int, now_ms: int,
                          ttl_ms_per_worker: int = 0, num_joining: int = 0) -> t.Lease:
        """Extend the lease by its TTL, raised first to ``lease_ttl_floor_ms`` of the
        fleet as it is now, ``num_joining`` included (a TTL never shrinks while held).
        Raises LeaseLost."""
        ...

    async def renew_leases(self, refs: Sequence[t.LeaseRef], now_ms: int,
                           ttl_ms_per_worker: int = 0,
                           num_joining: int = 0) -> list[t.LeaseRenewal]:
        """``renew_lease`` over a batch, atomically and in one round trip: one answer per
        ref, in order; a lost lease is an answer (GONE or FENCED), not an error."""
        ...

    async def release_lease(self, worker_id: str, epoch: int) -> None: ...

    async def live_leases(self) -> list[t.Lease]: ...

    async def change_role(self, worker_id: str, expected_epoch: int, role: t.WorkerRole,
                          allowed_from: Collection[t.WorkerRole] = ()) -> t.Lease:
        """Compare-and-set the role on the epoch; a success takes a fresh fence and keeps
        the lease's remaining TTL. ``allowed_from`` (when not empty) lists the roles the
        lease may hold now. Raises LeaseLost (gone or epoch moved on) or
        FailedPrecondition (role not in ``allowed_from``)."""
        ...

    async def record_event(self, job_id: str, event: dict[str, Any]) -> None: ...

    async def events(self, job_id: str) -> list[dict[str, Any]]: ...


MAX_LEASE_TTL_MS = 600_000


class RenewsOneAsABatch:
    """``renew_lease`` for a store: its ``renew_leases`` over a batch of one, so each
    store decides RENEWED / GONE / FENCED in one place and ``LeaseLost`` comes only from
    ``LeaseRenewal.lease_or_raise``."""

    async def renew_leases(self, refs: Sequence[t.LeaseRef], now_ms: int,
                           ttl_ms_per_worker: int = 0,
                           num_joining: int = 0) -> list[t.LeaseRenewal]:
        raise NotImplementedError

    async def renew_lease(self, worker_id: str, epoch: int, now_ms: int,
                          ttl_ms_per_worker: int = 0, num_joining: int = 0) -> t.Lease:
        renewed = await self.renew_leases([t.LeaseRef(worker_id, epoch)], now_ms,
                                          ttl_ms_per_worker, num_joining)
        return renewed[0].lease_or_raise()


def lease_ttl_floor_ms(ttl_ms_per_worker: int, num_workers: int) -> int:
    """The least TTL of a lease in a fleet of ``num_workers``: ``ttl_ms_per_worker``
    each (0: no floor), at most ``MAX_LEASE_TTL_MS``. Holders renew every third of their
    TTL, so the fleet's renewals per second stay at ``3000 / ttl_ms_per_worker``."""
    return min(MAX_LEASE_TTL_MS, ttl_ms_per_worker * num_workers)


def lease_lost_gone(worker_id: str) -> LeaseLost:
    return LeaseLost(f"lease of {worker_id} expired; acquire a new one")


def lease_lost_epoch(worker_id: str, current: int, expected: int) -> LeaseLost:
    return LeaseLost(f"lease of {worker_id} is at epoch {current}, not the expected "
                     f"epoch {expected}")


def role_refused(worker_id: str, current: str, role: t.WorkerRole,
                  allowed_from: Collection[t.WorkerRole]) -> FailedPrecondition:
    allowed = ", ".join(sorted(r.value for r in allowed_from))
    return FailedPrecondition(f"worker {worker_id} is {current}; {role.value} can only "
                              f"follow {allowed}")
