"""The coordinator's worker registry: leases (acquire, renew, release, list) and the
elastic hybrid pool's fenced role changes. Pure: the store comes in as the port
(``store_protocol.CoordinatorStore``); ``CoordinatorCore`` delegates its lease RPCs here.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

from libra import types as t
from libra.clock import Clock
from libra.errors import InvalidArgument
from libra.limits import MAX_LEASES_PER_RENEWAL, check_id
from services.coordinator.store_protocol import MAX_LEASE_TTL_MS, CoordinatorStore

logger = logging.getLogger(__name__)

MIN_LEASE_TTL_MS = 200
MAX_ADDRESS_CHARS = 512  # host:port or a unix socket path
# Grants the store works on at once; further registrations wait their turn here, where
# they cost nothing. A renewal is never held back: it queues behind at most this many
# grants (4 round trips each), not behind a burst of 1,000 (a fleet's first
# registration put every early holder's renewal behind the whole burst: lapses of live
# holders whose 3 s leases were granted first).
MAX_GRANTS_IN_FLIGHT = 8

# The elastic hybrid pool's role moves: target role -> roles a lease may hold before it.
# hybrid-rollout -> hybrid-joining (lend), hybrid-joining -> hybrid-training (activate),
# and back to hybrid-rollout from either (reclaim, failed or cancelled join).
ROLE_MOVES: dict[t.WorkerRole, tuple[t.WorkerRole, ...]] = {
    t.WorkerRole.HYBRID_JOINING: (t.WorkerRole.HYBRID_ROLLOUT,),
    t.WorkerRole.HYBRID_TRAINING: (t.WorkerRole.HYBRID_JOINING,),
    t.WorkerRole.HYBRID_ROLLOUT: (t.WorkerRole.HYBRID_JOINING, t.WorkerRole.HYBRID_TRAINING),
}


def ttl_ms_per_worker(renewals_per_s: float) -> int:
    """The TTL each worker adds to a lease's least TTL so that a fleet renewing every
    third of its TTL sends at most ``renewals_per_s`` renewals a second (0: no floor)."""
    return 0 if renewals_per_s <= 0 else math.ceil(3000 / renewals_per_s)


class WorkerRegistry:
    """Checks lease requests field by field (InvalidArgument naming the field), then
    lets the store grant, renew, fence and expire them.

    ``lease_renewals_per_s`` (> 0) scales lease TTLs with the fleet: a lease's TTL is at
    least 3 s x workers / that rate, so the renewals a fleet sends stay within it however
    large it grows (at 1,000 holders of 3 s leases they were 333 a second, and the
    coordinator and holders starved each other: lapses of live holders). The price is
    failure detection: a dead worker's work is re-placed after its TTL, not 3 s.

    The fleet a floor counts includes the registrations under way (``num_joining``):
    during a fleet's first registration the store holds only the workers granted so far,
    and the first leases got the asked 3 s while hundreds more were about to renew too.
    Counting them, a renewal during the burst raises an early lease's TTL to what the
    whole fleet's renewals allow, and grants beyond ``MAX_GRANTS_IN_FLIGHT`` wait here
    so that renewals are not queued behind them."""

    def __init__(self, store: CoordinatorStore, clock: Clock,
                 lease_renewals_per_s: float = 0.0) -> None:
        self._store = store
        self._clock = clock
        self._ttl_ms_per_worker = ttl_ms_per_worker(lease_renewals_per_s)
        self._grants = asyncio.Semaphore(MAX_GRANTS_IN_FLIGHT)
        self._num_registering = 0  # AcquireLease calls entered and not yet answered

    @property
    def num_registering(self) -> int:
        """Registrations under way: waiting for their turn or being granted."""
        return self._num_registering

    async def acquire_lease(self, worker_id: str, role: t.WorkerRole, bucket: str,
                            address: str, ttl_ms: int) -> t.Lease:
        check_id(worker_id, "worker_id")
        if bucket:
            check_id(bucket, "bucket")
        if len(address) > MAX_ADDRESS_CHARS or not address.isprintable():
            raise InvalidArgument("address", f"a host:port, at most {MAX_ADDRESS_CHARS} "
                                  "printable characters")
        if not MIN_LEASE_TTL_MS <= ttl_ms <= MAX_LEASE_TTL_MS:
            raise InvalidArgument("ttl_ms", f"must be in [{MIN_LEASE_TTL_MS}, "
                                  f"{MAX_LEASE_TTL_MS}]")
        lease = t.Lease(t.WorkerId(worker_id), role, bucket, address, 0, 0, ttl_ms)
        self._num_registering += 1
        try:
            async with self._grants:
                # The others still registering count: they renew soon too.
                granted = await self._store.acquire_lease(
                    lease, self._ttl_ms_per_worker, self._num_registering - 1)
        finally:
            self._num_registering -= 1
        logger.info("[lease] granted worker_id=%s role=%s bucket=%s epoch=%d ttl_ms=%d",
                    worker_id, role.value, bucket, granted.epoch, granted.ttl_ms)
        return granted

    async def renew_lease(self, worker_id: str, epoch: int) -> t.Lease:
        check_id(worker_id, "worker_id")
        return await self._store.renew_lease(worker_id, epoch, self._clock.now_ms(),
                                             self._ttl_ms_per_worker, self._num_registering)

    async def renew_leases(self, refs: Sequence[t.LeaseRef]) -> list[t.LeaseRenewal]:
        """Renew a process's leases in one store call: one answer per lease, in order (a
        lost one is an answer). Refused whole, naming the field, when the batch is over
        ``MAX_LEASES_PER_RENEWAL``, an id is malformed or a worker is named twice."""
        if len(refs) > MAX_LEASES_PER_RENEWAL:
            raise InvalidArgument("leases", f"{len(refs)} leases, at most "
                                  f"{MAX_LEASES_PER_RENEWAL} a call (split the batch)")
        seen: set[str] = set()
        for i, ref in enumerate(refs):
            check_id(ref.worker_id, f"leases[{i}].worker_id")
            if ref.worker_id in seen:  # two answers for one lease: which one holds?
                raise InvalidArgument(f"leases[{i}].worker_id",
                                      f"{ref.worker_id} is named twice in the batch")
            seen.add(ref.worker_id)
        if not refs:
            return []
        return await self._store.renew_leases(refs, self._clock.now_ms(),
                                              self._ttl_ms_per_worker, self._num_registering)

    async def release_lease(self, worker_id: str, epoch: int) -> None:
        check_id(worker_id, "worker_id")
        await self._store.release_lease(worker_id, epoch)

    async def change_worker_role(self, worker_id: str, expected_epoch: int,
                                 role: t.WorkerRole) -> t.Lease:
        """Compare-and-set of the role on ``expected_epoch`` (elastic hybrid pool).

        Only the moves in ``ROLE_MOVES`` are allowed; the store checks the current role
        and the epoch atomically, and a success takes a fresh fence (the new epoch).
        """
        check_id(worker_id, "worker_id")
        allowed_from = ROLE_MOVES.get(role)
        if allowed_from is None:
            targets = ", ".join(r.value for r in ROLE_MOVES)
            raise InvalidArgument("role", f"{role.value} is not a role a lease can change "
                                  f"to (one of {targets})")
        lease = await self._store.change_role(worker_id, expected_epoch, role, allowed_from)
        logger.info("[lease] role changed worker_id=%s role=%s epoch=%d->%d", worker_id,
                    role.value, expected_epoch, lease.epoch)
        return lease

    async def list_workers(self) -> list[t.Lease]:
        return await self._store.live_leases()
