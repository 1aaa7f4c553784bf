"""The trainer store's contract, run against RedisTrainerStore (real redis-server) and
MemoryTrainerStore alike: the stream's consumer group (new, pending, acked entries), the
exactly-once ``consume``, counters, the job record, the policy pointer, events and the
weight versions live instances hold."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from libra import types as t
from tests.store.trainer_worlds import MemoryWorld, RedisWorld, World

JOB = "job-c"
CONSUMER = "trainer-0"


@pytest.fixture(params=["redis", "memory"])
def world(request: pytest.FixtureRequest) -> World:
    if request.param == "memory":
        return MemoryWorld()
    redis_bytes: aioredis.Redis = request.getfixturevalue("redis_bytes")
    return RedisWorld(redis_bytes)


def traj(traj_id: str) -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId(traj_id), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", status=t.TrajectoryStatus.FINISHED)


def ids(got: list[tuple[str, t.Trajectory]]) -> list[str]:
    return [tr.trajectory_id for _, tr in got]


async def test_the_job_record_is_read_and_a_missing_run_dir_is_an_error(world: World) -> None:
    store = world.store
    assert await store.job_spec_json(JOB) is None
    await world.put_job(JOB, '{"name": "x"}', "/runs/x")
    assert await store.job_spec_json(JOB) == '{"name": "x"}'
    assert await store.job_run_dir(JOB) == "/runs/x"
    await world.put_job("other", "{}", "")
    with pytest.raises(RuntimeError, match="has no run_dir"):
        await store.job_run_dir("other")


async def test_a_read_before_the_group_exists_is_refused(world: World) -> None:
    await world.append(JOB, traj("a"))
    with pytest.raises(Exception, match="NOGROUP"):
        await world.store.read(JOB, CONSUMER, 10, block_ms=1)


async def test_reads_hand_out_new_entries_once_up_to_count(world: World) -> None:
    store = world.store
    await store.ensure_group(JOB)
    await store.ensure_group(JOB)  # a second call changes nothing
    for name in ("a", "b", "c"):
        await world.append(JOB, traj(name))
    assert ids(await store.read(JOB, CONSUMER, 2, block_ms=1)) == ["a", "b"]
    assert ids(await store.read(JOB, CONSUMER, 2, block_ms=1)) == ["c"]
    assert await store.read(JOB, CONSUMER, 2, block_ms=1) == []  # waited 1 ms, nothing


async def test_a_blocked_read_returns_the_entry_that_arrives(world: World) -> None:
    store = world.store
    await store.ensure_group(JOB)
    reading = asyncio.create_task(store.read(JOB, CONSUMER, 10, block_ms=10_000))
    await asyncio.sleep(0.05)  # not needed for the outcome: the read waits either way
    await world.append(JOB, traj("late"))
    assert ids(await asyncio.wait_for(reading, 10.0)) == ["late"]


async def test_pending_reads_return_delivered_unacked_entries_until_consumed(
        world: World) -> None:
    store = world.store
    await store.ensure_group(JOB)
    for name in ("a", "b", "c"):
        await world.append(JOB, traj(name))
    got = await store.read(JOB, CONSUMER, 10, block_ms=1)
    assert await world.num_pending(JOB) == 3
    await store.consume(JOB, [got[0][0]], ["a"], trained=1)
    # A restarted trainer (same consumer) gets the rest again, all at once.
    again = await store.read(JOB, CONSUMER, 1, block_ms=1, pending=True)
    assert ids(again) == ["b", "c"]
    assert [e for e, _ in again] == [e for e, _ in got[1:]]
    assert await store.read(JOB, "trainer-1", 10, block_ms=1, pending=True) == []
    await store.consume(JOB, [e for e, _ in again], [])
    assert await world.num_pending(JOB) == 0
    assert await store.read(JOB, CONSUMER, 10, block_ms=1, pending=True) == []


async def test_consume_counts_once_and_a_repeat_changes_nothing(world: World) -> None:
    store = world.store
    for _ in range(2):
        await store.consume(JOB, [], ["a", "b"], trained=2, dropped_stale=0)
    assert await store.counters(JOB) == {"trained": 2}
    assert await store.already_consumed(JOB, ["a", "x", "b"]) == [True, False, True]
    assert await store.already_consumed(JOB, []) == []
    # Counters-only calls (dropped groups) have no id to recognise a repeat by.
    await store.consume(JOB, [], [], dropped_groups=1)
    await store.consume(JOB, [], [], dropped_groups=1)
    assert (await store.counters(JOB))["dropped_groups"] == 2


async def test_counters_include_what_other_services_count(world: World) -> None:
    await world.add_counters(JOB, produced=3, **{"placed:short": 2})
    await world.store.consume(JOB, [], ["a"], trained=1)
    assert await world.store.counters(JOB) == {"produced": 3, "placed:short": 2, "trained": 1}
    assert await world.store.counters("none") == {}


async def test_the_policy_pointer_announces_the_last_published_version(world: World) -> None:
    store = world.store
    assert await store.policy_version(JOB) == -1
    for version in (0, 1):
        await store.publish_policy(JOB, t.PolicyInfo(version, f"/w/{version}", "ab", "/m", 7))
    assert await store.policy_version(JOB) == 1
    assert await world.policy(JOB) == {"version": "1", "weights_path": "/w/1", "sha256": "ab",
                                       "model_dir": "/m", "published_at_ms": "7"}


async def test_running_jobs_are_listed_oldest_first(world: World) -> None:
    await world.put_job("b", "{}", "/b", created_at_ms=2)
    await world.put_job("a", "{}", "/a", created_at_ms=1)
    await world.put_job("done", "{}", "/d", state="succeeded", created_at_ms=0)
    assert await world.store.running_jobs() == ["a", "b"]
    await world.set_job_state("a", "cancelled")
    assert await world.store.running_jobs() == ["b"]


async def test_events_are_recorded_in_order(world: World) -> None:
    await world.store.record_event(JOB, "trainer_resumed", step="3", checkpoint="")
    await world.store.record_event(JOB, "init_from", checkpoint="/c")
    assert await world.events(JOB) == [{"kind": "trainer_resumed", "step": "3",
                                        "checkpoint": ""},
                                       {"kind": "init_from", "checkpoint": "/c"}]


async def test_weights_in_use_counts_live_instances_only(world: World) -> None:
    assert await world.store.weights_in_use(JOB) == set()
    await world.set_weights_in_use(JOB, "ro-1", 3, 4)
    await world.set_weights_in_use(JOB, "ro-2", 5)
    await world.set_weights_in_use(JOB, "ro-gone", 1)
    await world.set_lease_live("ro-1")
    await world.set_lease_live("ro-2")
    assert await world.store.weights_in_use(JOB) == {3, 4, 5}
    await world.set_lease_live("ro-1", live=False)
    assert await world.store.weights_in_use(JOB) == {5}
