"""A fleet's first registration: a burst of AcquireLease calls must not let the leases
granted first lapse while their holders renew (worker_registry.py).

Two causes, each a test that fails on the former registry: every registration of the
burst worked in the store at once, so a renewal queued behind all of them; and the TTL
floor counted only the workers granted so far, so the first leases kept the asked 3 s
while hundreds more holders were about to renew.

Real: the core, its worker registry and the in-memory store on a ``FakeClock``. The
store's round trip is a gate the test opens (``GatedStore``): the Redis store awaits
the network there, which is what lets calls overlap. Fakes: ``FakeRunner`` replaces
the trainer and scheduler clients (no job runs here).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from libra import types as t
from libra.clock import FakeClock
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from services.coordinator.worker_registry import MAX_GRANTS_IN_FLIGHT
from tests.fakes.runner import FakeRunner

FLEET = 1_000
PER_WORKER_MS = 12  # lease_renewals_per_s=250: a 12 s floor at 1,000 workers


class GatedStore(InMemoryCoordinatorStore):
    """The in-memory store whose grants wait for ``gate`` (a round trip in flight),
    counting how many are inside at once."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.gate = asyncio.Event()
        self.inside = self.most_inside = 0

    async def acquire_lease(self, lease, ttl_ms_per_worker=0, num_joining=0):  # noqa: ANN001, ANN201
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            await self.gate.wait()
            return await super().acquire_lease(lease, ttl_ms_per_worker, num_joining)
        finally:
            self.inside -= 1


def make_core() -> tuple[CoordinatorCore, GatedStore]:
    clock = FakeClock()
    store = GatedStore(clock)
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), clock, Path("/tmp/libra-test-runs"),
                           lease_renewals_per_s=250.0)
    return core, store


def register(core: CoordinatorCore, worker_id: str) -> asyncio.Task[t.Lease]:
    return asyncio.create_task(core.acquire_lease(worker_id, t.WorkerRole.CORE_ROLLOUT,
                                                  "short", "127.0.0.1:1", 3_000))


async def settle() -> None:
    """Let every started task run up to where it waits."""
    for _ in range(10):
        await asyncio.sleep(0)


async def first_lease(core: CoordinatorCore, store: GatedStore) -> t.Lease:
    store.gate.set()
    lease = await register(core, "first")
    store.gate.clear()
    return lease


async def test_a_registration_burst_reaches_the_store_a_few_grants_at_a_time() -> None:
    core, store = make_core()
    burst = [register(core, f"w{i:04d}") for i in range(FLEET)]
    await settle()
    assert store.most_inside == MAX_GRANTS_IN_FLIGHT  # the rest wait in the registry
    store.gate.set()
    granted = await asyncio.gather(*burst)
    assert len({lease.epoch for lease in granted}) == FLEET  # every one granted, once
    assert store.most_inside == MAX_GRANTS_IN_FLIGHT


async def test_a_renewal_during_a_burst_sizes_the_ttl_for_the_whole_fleet() -> None:
    core, store = make_core()
    lease = await first_lease(core, store)
    assert lease.ttl_ms == 3_000  # alone: the asked TTL is above the floor
    burst = [register(core, f"w{i:04d}") for i in range(FLEET - 1)]
    await settle()
    # The renewal is answered while the burst waits (it is not queued behind it), and
    # its TTL counts the 999 registrations under way: 12 ms x 1,000, not the 3 s held.
    renewed = await core.renew_leases([t.LeaseRef(lease.worker_id, lease.epoch)])
    assert renewed[0].lease_or_raise().ttl_ms == PER_WORKER_MS * FLEET
    single = await core.renew_lease(lease.worker_id, lease.epoch)
    assert single.ttl_ms == PER_WORKER_MS * FLEET
    store.gate.set()
    await asyncio.gather(*burst)


async def test_a_grant_behind_a_burst_counts_the_registrations_still_waiting() -> None:
    core, store = make_core()
    burst = [register(core, f"w{i:04d}") for i in range(FLEET)]
    await settle()
    store.gate.set()
    granted = await asyncio.gather(*burst)
    # The first grants were in the store before the rest arrived; every later one saw
    # the whole fleet (granted + waiting): 12 ms x 1,000.
    later = granted[MAX_GRANTS_IN_FLIGHT:]
    assert min(lease.ttl_ms for lease in later) == PER_WORKER_MS * FLEET
    assert store.inside == 0
