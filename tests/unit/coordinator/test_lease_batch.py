"""CoordinatorCore.renew_leases: a process's leases renewed in one call (RenewLeases).

Real: the core, its worker registry and the in-memory store on a ``FakeClock`` (the Redis
store runs the same contract in tests/store/test_lease_batch_contract.py; the gRPC
shell in tests/service/coordinator/test_lease_batch_grpc.py). Fakes: ``FakeRunner``
replaces the trainer and scheduler clients (no job runs here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.errors import InvalidArgument, LeaseLost
from libra.limits import MAX_LEASES_PER_RENEWAL
from libra.wire.coordinator import (
    lease_refs_from_proto,
    lease_refs_to_proto,
    renewals_from_proto,
    renewals_to_proto,
)
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from tests.fakes.runner import FakeRunner


class CountingStore(InMemoryCoordinatorStore):
    """The in-memory store, counting batched renewals (one store call per batch)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.batches: list[int] = []

    async def renew_leases(self, refs, now_ms, ttl_ms_per_worker=0,  # noqa: ANN001, ANN201
                           num_joining=0):  # noqa: ANN001
        self.batches.append(len(refs))
        return await super().renew_leases(refs, now_ms, ttl_ms_per_worker, num_joining)


def make_core(renewals_per_s: float = 0.0) -> tuple[CoordinatorCore, CountingStore, FakeClock]:
    clock = FakeClock()
    store = CountingStore(clock)
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), clock, Path("/tmp/libra-test-runs"),
                           lease_renewals_per_s=renewals_per_s)
    return core, store, clock


async def acquire(core: CoordinatorCore, worker_id: str, ttl_ms: int = 1000) -> t.Lease:
    return await core.acquire_lease(worker_id, t.WorkerRole.CORE_ROLLOUT, "short",
                                    "127.0.0.1:1", ttl_ms)


def ref(lease: t.Lease) -> t.LeaseRef:
    return t.LeaseRef(lease.worker_id, lease.epoch)


async def test_one_store_call_renews_a_batch_and_extends_each_lease_from_now() -> None:
    core, store, clock = make_core()
    held = [await acquire(core, f"w{i}") for i in range(3)]
    clock.advance(0.6)
    renewals = await core.renew_leases([ref(x) for x in held])
    assert store.batches == [3]
    assert [r.lease_or_raise().expires_at_ms for r in renewals] == [clock.now_ms() + 1000] * 3
    clock.advance(0.6)  # past the first grant's expiry, within the renewal
    assert [w.worker_id for w in await core.list_workers()] == ["w0", "w1", "w2"]


async def test_a_batch_with_one_lapsed_lease_renews_the_rest_and_reports_it_lost() -> None:
    core, _, clock = make_core()
    lapsing = await acquire(core, "lapsing", ttl_ms=500)
    live = await acquire(core, "live", ttl_ms=5000)
    clock.advance(0.6)
    renewals = await core.renew_leases([ref(lapsing), ref(live)])
    assert [(r.worker_id, r.outcome) for r in renewals] == [
        ("lapsing", t.RenewOutcome.GONE), ("live", t.RenewOutcome.RENEWED)]
    with pytest.raises(LeaseLost):
        renewals[0].lease_or_raise()


async def test_a_batch_naming_a_foreign_lease_is_fenced_and_does_not_extend_it() -> None:
    core, _, clock = make_core()
    mine = await acquire(core, "mine", ttl_ms=5000)
    stale = await acquire(core, "theirs", ttl_ms=1000)
    current = await acquire(core, "theirs", ttl_ms=1000)  # re-registered: a new holder
    renewals = await core.renew_leases([ref(mine), ref(stale)])
    assert [r.outcome for r in renewals] == [t.RenewOutcome.RENEWED, t.RenewOutcome.FENCED]
    clock.advance(1.001)  # the foreign lease runs out on its own TTL
    assert [w.worker_id for w in await core.list_workers()] == ["mine"]
    assert current.epoch > stale.epoch


async def test_an_empty_batch_answers_nothing_and_touches_no_store() -> None:
    core, store, _ = make_core()
    assert await core.renew_leases([]) == []
    assert store.batches == []


async def test_a_batch_over_the_limit_is_refused_naming_leases() -> None:
    core, store, _ = make_core()
    lease = await acquire(core, "w0")
    refs = [t.LeaseRef(f"w{i}", 1) for i in range(MAX_LEASES_PER_RENEWAL + 1)]
    with pytest.raises(InvalidArgument) as info:
        await core.renew_leases(refs)
    assert info.value.field == "leases"
    assert store.batches == []  # refused whole: nothing renewed
    assert (await core.renew_leases([ref(lease)]))[0].outcome is t.RenewOutcome.RENEWED


@pytest.mark.parametrize(("refs", "field"), [
    ([t.LeaseRef("w0", 1), t.LeaseRef("", 1)], "leases[1].worker_id"),
    ([t.LeaseRef("w0", 1), t.LeaseRef("bad id\n", 1)], "leases[1].worker_id"),
    ([t.LeaseRef("w0", 1), t.LeaseRef("w1", 2), t.LeaseRef("w0", 3)], "leases[2].worker_id"),
])
async def test_a_bad_or_repeated_worker_id_is_refused_naming_its_place(
        refs: list[t.LeaseRef], field: str) -> None:
    core, store, _ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await core.renew_leases(refs)
    assert info.value.field == field
    assert store.batches == []


async def test_a_batch_raises_ttls_to_the_fleet_floor_like_a_single_renewal() -> None:
    core, _, _ = make_core(renewals_per_s=1.0)  # 3 s per worker
    held = [await acquire(core, w, ttl_ms=1000) for w in ("w1", "w2")]
    renewals = await core.renew_leases([ref(x) for x in held])
    assert [r.lease_or_raise().ttl_ms for r in renewals] == [6000, 6000]


def test_the_wire_codec_round_trips_refs_and_every_outcome() -> None:
    refs = [t.LeaseRef("a", 3), t.LeaseRef("b", 9)]
    assert lease_refs_from_proto(lease_refs_to_proto(refs)) == refs
    lease = t.Lease(t.WorkerId("a"), t.WorkerRole.HYBRID_ROLLOUT, "long", "h:1", 3, 7_000, 6_000)
    renewals = [t.LeaseRenewal("a", 3, t.RenewOutcome.RENEWED, lease),
                t.LeaseRenewal("b", 9, t.RenewOutcome.GONE),
                t.LeaseRenewal("c", 2, t.RenewOutcome.FENCED)]
    assert renewals_from_proto(renewals_to_proto(renewals)) == renewals
