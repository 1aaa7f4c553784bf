"""Batched lease renewal (``renew_leases``), one contract run against both store adapters:
the in-memory store on a ``FakeClock`` and the Redis store on the session's real
redis-server (one Lua script over the batch). A lost lease is an answer in its place,
not an error, and the batch's other leases are still renewed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from libra import types as t
from libra.clock import Clock, FakeClock, SystemClock
from libra.errors import LeaseLost
from services.coordinator.store import (
    CoordinatorStore,
    InMemoryCoordinatorStore,
    RedisCoordinatorStore,
)
from tests.store.test_coordinator_store_contract import SHORT_TTL_MS, make_lease


@dataclass
class StoreUnderTest:
    store: CoordinatorStore
    clock: Clock  # the store's: a renewal's ``now_ms`` comes from it, as the registry's
    fake: FakeClock | None = None

    async def expire(self, ms: int) -> None:
        """Let at least ``ms`` pass (the fake clock's time, or real time for Redis)."""
        if self.fake is not None:
            self.fake.advance(ms / 1000)
        else:
            await asyncio.sleep(ms / 1000)

    def now_ms(self) -> int:
        return self.clock.now_ms()


@pytest.fixture(params=["memory", "redis"])
def sut(request: pytest.FixtureRequest) -> StoreUnderTest:
    if request.param == "memory":
        clock = FakeClock()
        return StoreUnderTest(InMemoryCoordinatorStore(clock), clock, clock)
    clock = SystemClock()
    return StoreUnderTest(RedisCoordinatorStore(request.getfixturevalue("redis"), clock), clock)

RENEWED, GONE, FENCED = t.RenewOutcome.RENEWED, t.RenewOutcome.GONE, t.RenewOutcome.FENCED


async def test_a_batch_renews_every_lease_held_and_answers_in_order(
        sut: StoreUnderTest) -> None:
    held = [await sut.store.acquire_lease(make_lease(w, ttl_ms=5_000)) for w in ("c", "a", "b")]
    now_ms = sut.now_ms()
    renewals = await sut.store.renew_leases([t.LeaseRef(x.worker_id, x.epoch) for x in held],
                                            now_ms)
    assert [(r.worker_id, r.epoch, r.outcome) for r in renewals] == [
        (x.worker_id, x.epoch, RENEWED) for x in held]
    for renewal, lease in zip(renewals, held, strict=True):
        assert renewal.lease_or_raise() == t.Lease(
            lease.worker_id, lease.role, lease.bucket, lease.address, lease.epoch,
            now_ms + 5_000, 5_000)


async def test_a_lapsed_lease_is_answered_gone_and_the_others_are_renewed(
        sut: StoreUnderTest) -> None:
    lapsing = await sut.store.acquire_lease(make_lease("lapsing", ttl_ms=SHORT_TTL_MS))
    live = await sut.store.acquire_lease(make_lease("live", ttl_ms=10_000))
    await sut.expire(SHORT_TTL_MS + 60)
    renewals = await sut.store.renew_leases(
        [t.LeaseRef("lapsing", lapsing.epoch), t.LeaseRef("live", live.epoch)], sut.now_ms())
    assert [r.outcome for r in renewals] == [GONE, RENEWED]
    assert renewals[0].lease is None
    with pytest.raises(LeaseLost, match="expired"):
        renewals[0].lease_or_raise()
    assert [x.worker_id for x in await sut.store.live_leases()] == ["live"]


async def test_a_lease_granted_to_another_holder_is_fenced_and_left_alone(
        sut: StoreUnderTest) -> None:
    mine = await sut.store.acquire_lease(make_lease("mine"))
    old = await sut.store.acquire_lease(make_lease("theirs", ttl_ms=SHORT_TTL_MS * 4))
    current = await sut.store.acquire_lease(make_lease("theirs", ttl_ms=SHORT_TTL_MS * 4))
    renewals = await sut.store.renew_leases(
        [t.LeaseRef("mine", mine.epoch), t.LeaseRef("theirs", old.epoch)], sut.now_ms())
    assert [r.outcome for r in renewals] == [RENEWED, FENCED]
    with pytest.raises(LeaseLost, match="newer epoch"):
        renewals[1].lease_or_raise()
    # The foreign holder's lease is untouched: same epoch, not extended by our batch.
    [theirs] = [x for x in await sut.store.live_leases() if x.worker_id == "theirs"]
    assert theirs.epoch == current.epoch
    await sut.expire(SHORT_TTL_MS * 4 + 60)
    assert [x.worker_id for x in await sut.store.live_leases()] == ["mine"]


async def test_an_empty_batch_answers_nothing(sut: StoreUnderTest) -> None:
    assert await sut.store.renew_leases([], sut.now_ms()) == []


async def test_a_batch_raises_every_ttl_to_the_fleet_floor(sut: StoreUnderTest) -> None:
    held = [await sut.store.acquire_lease(make_lease(w, ttl_ms=1_000)) for w in ("a", "b")]
    renewals = await sut.store.renew_leases([t.LeaseRef(x.worker_id, x.epoch) for x in held],
                                            sut.now_ms(), ttl_ms_per_worker=4_000)
    assert [r.lease_or_raise().ttl_ms for r in renewals] == [8_000, 8_000]  # 2 workers


async def test_the_floor_counts_the_workers_still_registering(sut: StoreUnderTest) -> None:
    # During a fleet's first registration the store holds 1 worker while 9 more are on
    # their way: a grant and a renewal size the TTL for all 10 (4 s each).
    first = await sut.store.acquire_lease(make_lease("a", ttl_ms=1_000),
                                          ttl_ms_per_worker=4_000, num_joining=9)
    assert first.ttl_ms == 40_000
    held = await sut.store.acquire_lease(make_lease("b", ttl_ms=1_000))
    (renewal,) = await sut.store.renew_leases([t.LeaseRef("b", held.epoch)], sut.now_ms(),
                                              ttl_ms_per_worker=4_000, num_joining=8)
    assert renewal.lease_or_raise().ttl_ms == 40_000  # 2 in the store + 8 joining
