"""One contract suite for the coordinator store, run against both adapters.

``InMemoryCoordinatorStore`` expires leases by a ``FakeClock``; ``RedisCoordinatorStore``
runs against the session's real redis-server and expires leases by real PX TTLs (short
ones, so the file stays fast). Nothing is faked on the Redis side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock, SystemClock
from libra.errors import FailedPrecondition, LeaseLost, NotFound
from services.coordinator.store import (
    MAX_LEASE_TTL_MS,
    CoordinatorStore,
    InMemoryCoordinatorStore,
    RedisCoordinatorStore,
    StepAppend,
)

SHORT_TTL_MS = 300


@dataclass
class StoreUnderTest:
    store: CoordinatorStore
    expire: Callable[[int], Awaitable[None]]  # let at least this many ms pass
    redis: Any = None


@pytest.fixture(params=["memory", "redis"])
def sut(request: pytest.FixtureRequest) -> StoreUnderTest:
    if request.param == "memory":
        clock = FakeClock()

        async def advance(ms: int) -> None:
            clock.advance(ms / 1000)

        return StoreUnderTest(InMemoryCoordinatorStore(clock), advance)
    redis = request.getfixturevalue("redis")

    async def sleep(ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    return StoreUnderTest(RedisCoordinatorStore(redis, SystemClock()), sleep, redis)


def make_job(job_id: str = "job-1", created_at_ms: int = 1_000,
             state: t.JobState = t.JobState.RUNNING) -> t.Job:
    return t.Job(job_id=t.JobId(job_id), name="n", state=state,
                 spec_json=json.dumps({"name": "n"}), created_at_ms=created_at_ms,
                 updated_at_ms=created_at_ms, message="m", step=3, policy_version=2,
                 run_dir=f"/runs/{job_id}")


def make_lease(worker_id: str = "w1", ttl_ms: int = 5_000) -> t.Lease:
    return t.Lease(t.WorkerId(worker_id), t.WorkerRole.HYBRID_ROLLOUT, "long",
                   "10.0.0.1:5000", 0, 0, ttl_ms)


# -- jobs -----------------------------------------------------------------------------


async def test_put_then_get_returns_equal_job(sut: StoreUnderTest) -> None:
    job = make_job()
    await sut.store.put_job(job)
    assert await sut.store.get_job(job.job_id) == job


async def test_put_overwrites_existing_job(sut: StoreUnderTest) -> None:
    job = make_job()
    await sut.store.put_job(job)
    job.state, job.message = t.JobState.CANCELLED, "bye"
    await sut.store.put_job(job)
    got = await sut.store.get_job(job.job_id)
    assert (got.state, got.message) == (t.JobState.CANCELLED, "bye")


async def test_get_unknown_job_raises_not_found(sut: StoreUnderTest) -> None:
    with pytest.raises(NotFound):
        await sut.store.get_job("nope")


async def test_list_jobs_orders_by_creation_time(sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job("late", created_at_ms=3_000))
    await sut.store.put_job(make_job("early", created_at_ms=1_000))
    assert [j.job_id for j in await sut.store.list_jobs()] == ["early", "late"]


async def test_job_summaries_are_the_jobs_without_their_specs(sut: StoreUnderTest) -> None:
    late, early = make_job("late", created_at_ms=3_000), make_job("early", created_at_ms=1_000)
    early.priority, early.num_resumes = 4, 2
    for job in (late, early):
        await sut.store.put_job(job)
    summaries = await sut.store.list_job_summaries()
    assert summaries == [dataclasses.replace(j, spec_json="") for j in (early, late)]
    assert (await sut.store.get_job("early")).spec_json  # the stored job keeps its spec


async def test_delete_job_removes_job_and_its_history(sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job())
    await sut.store.append_step("job-1", {"step": 1})
    await sut.store.delete_job("job-1")
    with pytest.raises(NotFound):
        await sut.store.get_job("job-1")
    assert await sut.store.list_jobs() == []
    assert await sut.store.steps("job-1") == []


async def test_delete_unknown_job_is_a_no_op(sut: StoreUnderTest) -> None:
    await sut.store.delete_job("nope")
    assert await sut.store.list_jobs() == []


async def test_steps_come_back_in_append_order(sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job())
    records = [{"step": i, "reward_mean": i / 10, "tags": ["a"]} for i in range(3)]
    for record in records:
        await sut.store.append_step("job-1", record)
    assert await sut.store.steps("job-1") == records


async def test_a_repeated_step_key_is_recognised_and_stored_once(sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job())
    first = await sut.store.append_step("job-1", {"step": 1, "loss": 0.5}, "job-1:1:a")
    again = await sut.store.append_step("job-1", {"step": 1, "loss": 0.5}, "job-1:1:a")
    assert (first, again) == (StepAppend.STORED, StepAppend.REPEAT)
    assert await sut.store.steps("job-1") == [{"step": 1, "loss": 0.5}]


async def test_without_a_key_any_repeat_of_a_step_is_a_retry(sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job())
    await sut.store.append_step("job-1", {"step": 1, "loss": 0.5})
    assert await sut.store.append_step("job-1", {"step": 1, "loss": 0.9}) is StepAppend.REPEAT
    assert await sut.store.steps("job-1") == [{"step": 1, "loss": 0.5}]


async def test_another_key_for_a_stored_step_replaces_it_in_step_order(
        sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job())
    for step in (1, 2, 3):
        await sut.store.append_step("job-1", {"step": step, "run": "a"}, f"job-1:{step}:a")
    # A trainer resumed from its step-1 checkpoint redoes steps 2 and 3.
    for step in (2, 3):
        outcome = await sut.store.append_step("job-1", {"step": step, "run": "b"},
                                              f"job-1:{step}:b")
        assert outcome is StepAppend.REPLACED
    assert await sut.store.steps("job-1") == [
        {"step": 1, "run": "a"}, {"step": 2, "run": "b"}, {"step": 3, "run": "b"}]


async def test_counters_of_a_job_without_any_are_empty(sut: StoreUnderTest) -> None:
    await sut.store.put_job(make_job())
    assert await sut.store.counters("job-1") == {}


async def test_redis_counters_are_read_as_ints(redis: Any) -> None:
    store = RedisCoordinatorStore(redis, SystemClock())
    await redis.hincrby(keys.counters("job-1"), "trained", 7)
    assert await store.counters("job-1") == {"trained": 7}


async def test_redis_terminal_job_keys_get_a_ttl(redis: Any) -> None:
    store = RedisCoordinatorStore(redis, SystemClock())
    await store.put_job(make_job(state=t.JobState.SUCCEEDED))
    assert 0 < await redis.pttl(keys.job("job-1")) <= keys.FINISHED_JOB_TTL_MS


# -- leases ---------------------------------------------------------------------------


async def test_acquire_grants_lease_with_fields_and_positive_epoch(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    assert lease.epoch >= 1
    assert (lease.worker_id, lease.role, lease.bucket, lease.address, lease.ttl_ms) == (
        "w1", t.WorkerRole.HYBRID_ROLLOUT, "long", "10.0.0.1:5000", 5_000)
    (live,) = await sut.store.live_leases()
    assert dataclasses.replace(live, expires_at_ms=0) == dataclasses.replace(
        lease, expires_at_ms=0)
    assert abs(live.expires_at_ms - lease.expires_at_ms) < 1_000


async def test_epochs_are_strictly_increasing_across_workers(sut: StoreUnderTest) -> None:
    epochs = [(await sut.store.acquire_lease(make_lease(w))).epoch
              for w in ("w1", "w2", "w1", "w3")]
    assert all(a < b for a, b in zip(epochs, epochs[1:], strict=False))


async def test_renew_with_current_epoch_keeps_lease(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    renewed = await sut.store.renew_lease("w1", lease.epoch, 10_000)
    assert renewed.epoch == lease.epoch
    assert renewed.expires_at_ms > 10_000


async def test_a_ttl_per_worker_raises_the_ttl_with_the_fleet(sut: StoreUnderTest) -> None:
    # 3 workers x 4 s each: a 12 s floor above the 5 s asked for.
    first = await sut.store.acquire_lease(make_lease("w1"), ttl_ms_per_worker=4_000)
    assert first.ttl_ms == 5_000  # alone: 4 s floor, below the asked TTL
    for worker in ("w2", "w3"):
        await sut.store.acquire_lease(make_lease(worker))
    third = await sut.store.acquire_lease(make_lease("w3"), ttl_ms_per_worker=4_000)
    assert third.ttl_ms == 12_000 and third.expires_at_ms > first.expires_at_ms
    # A renewal raises a lease granted while the fleet was smaller, and keeps it raised.
    now_ms = 2_000_000  # after either clock's start
    renewed = await sut.store.renew_lease("w1", first.epoch, now_ms, ttl_ms_per_worker=4_000)
    assert renewed.ttl_ms == 12_000 and renewed.expires_at_ms == now_ms + 12_000
    again = await sut.store.renew_lease("w1", first.epoch, now_ms)  # no floor: kept
    assert again.ttl_ms == 12_000
    (live,) = [x for x in await sut.store.live_leases() if x.worker_id == "w1"]
    assert live.ttl_ms == 12_000 and live.role is t.WorkerRole.HYBRID_ROLLOUT


async def test_a_ttl_floor_never_passes_the_largest_ttl(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease(), ttl_ms_per_worker=10_000_000)
    assert lease.ttl_ms == MAX_LEASE_TTL_MS
    renewed = await sut.store.renew_lease("w1", lease.epoch, 0, ttl_ms_per_worker=10_000_000)
    assert renewed.ttl_ms == MAX_LEASE_TTL_MS


async def test_renew_with_stale_epoch_raises_lease_lost(sut: StoreUnderTest) -> None:
    old = await sut.store.acquire_lease(make_lease())
    await sut.store.acquire_lease(make_lease())
    with pytest.raises(LeaseLost):
        await sut.store.renew_lease("w1", old.epoch, 0)


async def test_renew_of_unknown_worker_raises_lease_lost(sut: StoreUnderTest) -> None:
    with pytest.raises(LeaseLost):
        await sut.store.renew_lease("ghost", 1, 0)


async def test_renew_after_expiry_raises_lease_lost(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease(ttl_ms=SHORT_TTL_MS))
    await sut.expire(SHORT_TTL_MS + 60)
    with pytest.raises(LeaseLost):
        await sut.store.renew_lease("w1", lease.epoch, 0)


async def test_live_leases_drop_expired_ones(sut: StoreUnderTest) -> None:
    await sut.store.acquire_lease(make_lease("short", ttl_ms=SHORT_TTL_MS))
    await sut.store.acquire_lease(make_lease("long", ttl_ms=10_000))
    await sut.expire(SHORT_TTL_MS + 60)
    assert [x.worker_id for x in await sut.store.live_leases()] == ["long"]


async def test_redis_forgets_the_ids_of_expired_workers(redis: Any) -> None:
    # The workers set would otherwise keep every id ever seen (a 7-day stack: thousands).
    store = RedisCoordinatorStore(redis, SystemClock())
    for worker_id in ("gone", "live"):
        await store.acquire_lease(make_lease(worker_id, ttl_ms=10_000))
    await redis.delete(keys.lease("gone"))  # as if its TTL ran out
    assert [x.worker_id for x in await store.live_leases()] == ["live"]
    assert await redis.smembers(keys.WORKERS) == {"live"}
    await store.acquire_lease(make_lease("gone", ttl_ms=10_000))  # back: listed again
    assert [x.worker_id for x in await store.live_leases()] == ["gone", "live"]


async def test_reacquire_after_expiry_gets_a_newer_epoch(sut: StoreUnderTest) -> None:
    first = await sut.store.acquire_lease(make_lease(ttl_ms=SHORT_TTL_MS))
    await sut.expire(SHORT_TTL_MS + 60)
    second = await sut.store.acquire_lease(make_lease(ttl_ms=SHORT_TTL_MS))
    assert second.epoch > first.epoch


async def test_release_by_holder_removes_lease(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    await sut.store.release_lease("w1", lease.epoch)
    assert await sut.store.live_leases() == []
    with pytest.raises(LeaseLost):
        await sut.store.renew_lease("w1", lease.epoch, 0)


async def test_release_with_other_epoch_keeps_lease(sut: StoreUnderTest) -> None:
    old = await sut.store.acquire_lease(make_lease())
    current = await sut.store.acquire_lease(make_lease())
    await sut.store.release_lease("w1", old.epoch)
    assert [x.epoch for x in await sut.store.live_leases()] == [current.epoch]


async def test_live_leases_are_sorted_by_worker_id(sut: StoreUnderTest) -> None:
    for w in ("b", "c", "a"):
        await sut.store.acquire_lease(make_lease(w))
    assert [x.worker_id for x in await sut.store.live_leases()] == ["a", "b", "c"]


# -- role changes (elastic hybrid pool) ---------------------------------------------

JOINING, TRAINING = t.WorkerRole.HYBRID_JOINING, t.WorkerRole.HYBRID_TRAINING


async def test_change_role_takes_a_fresh_epoch_and_keeps_the_rest(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    await sut.store.acquire_lease(make_lease("w2"))  # the fence moved on meanwhile
    changed = await sut.store.change_role("w1", lease.epoch, JOINING)
    assert changed.role is JOINING and changed.epoch > lease.epoch + 1
    assert (changed.bucket, changed.address, changed.ttl_ms) == (
        lease.bucket, lease.address, lease.ttl_ms)
    (live,) = [x for x in await sut.store.live_leases() if x.worker_id == "w1"]
    assert (live.role, live.epoch) == (JOINING, changed.epoch)


async def test_change_role_keeps_the_lease_ttl(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease(ttl_ms=SHORT_TTL_MS))
    await sut.store.change_role("w1", lease.epoch, JOINING)
    await sut.expire(SHORT_TTL_MS + 60)
    assert await sut.store.live_leases() == []


async def test_changed_lease_renews_at_its_new_epoch_only(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    changed = await sut.store.change_role("w1", lease.epoch, JOINING)
    assert (await sut.store.renew_lease("w1", changed.epoch, 0)).role is JOINING
    with pytest.raises(LeaseLost):
        await sut.store.renew_lease("w1", lease.epoch, 0)


async def test_change_role_on_stale_epoch_names_both_epochs(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    changed = await sut.store.change_role("w1", lease.epoch, JOINING)
    with pytest.raises(LeaseLost) as err:
        await sut.store.change_role("w1", lease.epoch, TRAINING)
    assert f"epoch {changed.epoch}" in str(err.value)
    assert f"expected epoch {lease.epoch}" in str(err.value)


async def test_change_role_of_missing_lease_raises_lease_lost(sut: StoreUnderTest) -> None:
    with pytest.raises(LeaseLost):
        await sut.store.change_role("ghost", 1, JOINING)


async def test_change_role_refuses_a_move_from_a_role_not_allowed(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())  # hybrid-rollout
    with pytest.raises(FailedPrecondition) as err:
        await sut.store.change_role("w1", lease.epoch, TRAINING, (JOINING,))
    assert "hybrid-rollout" in str(err.value) and "hybrid-joining" in str(err.value)
    (live,) = await sut.store.live_leases()
    assert (live.role, live.epoch) == (t.WorkerRole.HYBRID_ROLLOUT, lease.epoch)


async def test_concurrent_changes_on_one_epoch_apply_once(sut: StoreUnderTest) -> None:
    lease = await sut.store.acquire_lease(make_lease())
    results = await asyncio.gather(
        *(sut.store.change_role("w1", lease.epoch, JOINING) for _ in range(5)),
        return_exceptions=True)
    assert sum(isinstance(r, t.Lease) for r in results) == 1
    assert sum(isinstance(r, LeaseLost) for r in results) == 4


async def test_events_keep_their_order_and_fields(sut: StoreUnderTest) -> None:
    await sut.store.record_event("job-1", {"ts_ms": 5, "kind": "plan", "inputs": {"a": 1}})
    await sut.store.record_event("job-1", {"ts_ms": 6, "kind": "released", "epoch": 3})
    assert await sut.store.events("job-1") == [
        {"ts_ms": 5, "kind": "plan", "inputs": {"a": 1}},
        {"ts_ms": 6, "kind": "released", "epoch": 3}]
    assert await sut.store.events("job-2") == []


async def test_redis_backlog_measures_what_is_still_in_flight(redis: Any) -> None:
    store = RedisCoordinatorStore(redis, SystemClock())
    assert await store.backlog("job-1") == {"in_flight_unconsumed": 0, "in_flight_running": 0,
                                            "in_flight_pending_admission": 0}
    stream = keys.trajectories("job-1")
    for i in range(5):
        await redis.xadd(stream, {"trajectory_id": f"tr-{i}"})
    assert (await store.backlog("job-1"))["in_flight_unconsumed"] == 5  # no trainer yet
    await redis.xgroup_create(stream, keys.TRAINER_GROUP, id="0")
    reply = await redis.xreadgroup(keys.TRAINER_GROUP, "trainer-0", {stream: ">"}, count=3)
    ids = [entry_id for entry_id, _ in reply[0][1]]
    await redis.xack(stream, keys.TRAINER_GROUP, ids[0])
    await redis.hset(keys.assignments("job-1"), mapping={"tr-7": "ro-0", "tr-8": "ro-1"})
    await redis.hset(keys.pending("job-1"), "tr-9", "task")
    # 2 delivered and not acked + 2 never delivered; 2 running; 1 waiting for a place.
    assert await store.backlog("job-1") == {"in_flight_unconsumed": 4, "in_flight_running": 2,
                                            "in_flight_pending_admission": 1}
