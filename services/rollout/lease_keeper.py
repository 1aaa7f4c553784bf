"""The rollout instance's lease: registration, renewal every third of its TTL, release.

The TTL is the one the coordinator granted, which may exceed the one asked for (it
scales TTLs with the fleet: ``lease_renewals_per_s``); each renewal's answer carries it.

Each renewal's deadline is half the time the lease has left
(``renewal_deadline_s``), not the client's default: a renewal stuck on a coordinator
that never answers then fails while a retry can still save the lease.

A lost lease means the scheduler re-placed what this instance held (finishing it here
would duplicate), so the keeper lets the core drop its work (``on_lost``) and registers
again. A registration that fails (the coordinator restarting) is tried again at each
beat: the loop never ends on a coordinator outage. A release that fails leaves the lease
to expire by its TTL.

Pure, like the core: the coordinator and the store come in as collaborators.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from libra import types as t
from libra.cancellation import raise_if_cancelled
from libra.errors import DeadlineExceeded, LeaseLost, LibraError, Unavailable
from libra.lease_timing import renewal_deadline_s, renewal_wait_s
from services.rollout.loop_types import LeaseHolder, RolloutSettings

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.api import CoordinatorApi
    from services.rollout.store_protocol import RolloutStore

logger = logging.getLogger(__name__)

# Start-up asks again after this, doubling up to the cap, while the coordinator is down.
START_RETRY_S = 0.5
START_RETRY_MAX_S = 5.0


class LeaseKeeper:
    """Holds this instance's lease (in the shared :class:`LeaseHolder`) for the core."""

    def __init__(self, settings: RolloutSettings, store: RolloutStore,
                 coordinator: CoordinatorApi, held: LeaseHolder,
                 on_lost: Callable[[], Awaitable[None]]) -> None:
        self.settings = settings
        self._store = store
        self._coordinator = coordinator
        self._held = held
        self._on_lost = on_lost
        # When the last answered renewal (or the grant) was asked for, by the loop's
        # clock: the lease lives at least its TTL from then.
        self._renewed_asked_s = 0.0

    async def register(self, wait_s: float = 0.0) -> t.Lease:
        """Take the lease, waiting up to ``wait_s`` for a coordinator that does not answer
        yet: compose, Kubernetes and `libra up` start the services in any order, and an
        instance that gave up at once would need a restart to join."""
        loop = asyncio.get_running_loop()
        deadline_s, retry_s = loop.time() + wait_s, START_RETRY_S
        while True:
            try:
                return await self._acquire()
            except (Unavailable, DeadlineExceeded) as exc:
                left_s = deadline_s - loop.time()
                if left_s <= 0:
                    raise
                logger.warning("[lease] coordinator not answering yet error=%s; asking again"
                               " (%.0fs of the start-up wait left)", exc, left_s)
                await asyncio.sleep(min(retry_s, left_s))
                retry_s = min(retry_s * 2, START_RETRY_MAX_S)

    async def _acquire(self) -> t.Lease:
        s = self.settings
        await self._store.ensure_inbox(s.instance_id)
        asked_s = asyncio.get_running_loop().time()
        self._held.lease = await self._coordinator.acquire_lease(
            s.instance_id, s.role, s.bucket, s.address, s.lease_ttl_ms)
        self._renewed_asked_s = asked_s
        return self._held.lease

    async def heartbeat(self, stopping: Callable[[], bool]) -> None:
        """Renew the lease every third of its TTL until ``stopping``, and soon again
        after a failed renewal (``libra/lease_timing.py``: a stall that ends while the
        lease lives must not cost it); on loss, drop work (``on_lost``) and re-register."""
        loop = asyncio.get_running_loop()
        is_registered, num_failed, began_s = True, 0, loop.time()
        while not stopping():
            raise_if_cancelled()
            await asyncio.sleep(renewal_wait_s(self._ttl_ms(), num_failed,
                                               loop.time() - began_s))
            began_s = loop.time()
            if self._held.lease is None:
                continue
            if not is_registered:
                is_registered = await self._register_again()
                continue
            try:
                async with self._held.lock:
                    lease = self._held.lease
                    self._held.lease = await self._coordinator.renew_lease(
                        lease.worker_id, lease.epoch, timeout_s=renewal_deadline_s(
                            lease.ttl_ms, began_s - self._renewed_asked_s))
                num_failed, self._renewed_asked_s = 0, began_s
            except LeaseLost:
                # The scheduler re-placed what we held; finishing it here would duplicate.
                await self._on_lost()
                is_registered, num_failed = await self._register_again(), 0
            except LibraError as exc:
                num_failed += 1
                logger.warning("[lease] renew failed error=%s; trying again in %.2fs", exc,
                               renewal_wait_s(self._ttl_ms(), num_failed))

    def _ttl_ms(self) -> int:
        """The held lease's granted TTL (the asked one before the first grant)."""
        lease = self._held.lease
        return self.settings.lease_ttl_ms if lease is None else lease.ttl_ms

    async def _register_again(self) -> bool:
        try:
            await self.register()
        except LibraError as exc:
            logger.warning("[lease] register failed error=%s; trying again next beat", exc)
            return False
        return True

    async def release(self) -> None:
        lease = self._held.lease
        if lease is None:
            return
        try:
            await self._coordinator.release_lease(lease.worker_id, lease.epoch)
        except LibraError as exc:
            # `libra down` stops the coordinator at the same time: the lease then
            # expires by its TTL instead, and the process still exits cleanly.
            logger.warning("[lease] release failed error=%s; it expires in %d ms", exc,
                           lease.ttl_ms)
