"""One contract suite for the placement-policy store, run against both adapters.

``InMemoryPolicyStore`` (simulator, tests) and ``RedisPolicyStore`` (the scheduler
service: an in-memory cache written behind to the session's real redis-server). For the
Redis store ``reopen`` flushes and loads a brand-new instance from Redis, so every
assertion made after it checks what survived a scheduler restart. Nothing is faked.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from libra import redis_keys as keys
from libra import types as t
from scheduling.policy.base import TrajectoryDescriptor
from scheduling.policy.cmlfq import CmlfqConfig, CmlfqPolicy
from scheduling.policy.layout import BucketLayout
from scheduling.policy.store import InMemoryPolicyStore, PolicyStore
from services.scheduler.store import RedisPolicyStore

JOB = "job-1"
FAIL = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.FAILURE)
OK = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)


@dataclass
class StoreUnderTest:
    store: PolicyStore
    reopen: Callable[[], Awaitable[PolicyStore]]  # what a restarted process would see
    redis: Any = None


@pytest.fixture(params=["memory", "redis"])
def sut(request: pytest.FixtureRequest) -> StoreUnderTest:
    if request.param == "memory":
        memory = InMemoryPolicyStore(copy_values=True)

        async def same() -> PolicyStore:
            return memory

        return StoreUnderTest(memory, same)
    redis = request.getfixturevalue("redis")
    holder = {"store": RedisPolicyStore(redis, JOB)}

    async def reopen() -> PolicyStore:
        await holder["store"].flush()
        fresh = RedisPolicyStore(redis, JOB)
        await fresh.load()
        holder["store"] = fresh
        return fresh

    return StoreUnderTest(holder["store"], reopen, redis)


def make_layout() -> BucketLayout:
    return BucketLayout([t.Bucket("short", 100, 1, 8, 100), t.Bucket("long", 10_000, 1, 8, 100)])


INSTANCES = [t.InstanceLoad(t.InstanceId("i-short"), "short", 0),
             t.InstanceLoad(t.InstanceId("i-long"), "long", 0)]


def teach(policy: CmlfqPolicy, prompt: str, total_tokens: int, times: int, tag: str) -> None:
    for i in range(times):
        tid = t.TrajectoryId(f"{tag}-{prompt}-{i}")
        policy.begin(TrajectoryDescriptor(tid, t.PromptId(prompt)), INSTANCES)
        policy.on_tool_return(tid, FAIL, 10, INSTANCES)
        policy.finish(tid, total_tokens)


# -- per-trajectory state ---------------------------------------------------------------


async def test_put_trajectory_is_read_back_after_reopen(sut: StoreUnderTest) -> None:
    sut.store.put_trajectory("t1", {"bucket": "short", "path_keys": ["a"]})
    store = await sut.reopen()
    assert store.get_trajectory("t1") == {"bucket": "short", "path_keys": ["a"]}


async def test_missing_trajectory_reads_none(sut: StoreUnderTest) -> None:
    assert sut.store.get_trajectory("nope") is None


async def test_deleted_trajectory_is_gone_after_reopen(sut: StoreUnderTest) -> None:
    sut.store.put_trajectory("t1", {"x": 1})
    store = await sut.reopen()
    store.delete_trajectory("t1")
    store.delete_trajectory("never-there")  # no error
    store = await sut.reopen()
    assert store.get_trajectory("t1") is None


async def test_stored_value_is_not_an_alias_of_the_callers(sut: StoreUnderTest) -> None:
    value = {"path_keys": ["a"]}
    sut.store.put_trajectory("t1", value)
    value["path_keys"].append("b")
    read = sut.store.get_trajectory("t1")
    assert read == {"path_keys": ["a"]}
    read["path_keys"].append("c")  # type: ignore[index]
    assert sut.store.get_trajectory("t1") == {"path_keys": ["a"]}


async def test_nested_value_is_not_an_alias_and_reads_back_as_json_would(
        sut: StoreUnderTest) -> None:
    value = {"n": {"k": [1]}, "pair": (1, 2), "deep": [[1]], "x": None, "f": 1.5}
    sut.store.put_trajectory("t1", value)
    value["n"]["k"].append(2)  # type: ignore[index]
    value["deep"][0].append(2)  # type: ignore[index]
    expected = {"n": {"k": [1]}, "pair": [1, 2], "deep": [[1]], "x": None, "f": 1.5}
    read = sut.store.get_trajectory("t1")
    assert read == expected
    read["n"]["k"].append(3)  # type: ignore[index]
    assert sut.store.get_trajectory("t1") == expected
    store = await sut.reopen()
    assert store.get_trajectory("t1") == expected


async def test_value_json_cannot_encode_is_refused_at_the_put(sut: StoreUnderTest) -> None:
    with pytest.raises(TypeError):
        sut.store.put_trajectory("t1", {"when": object()})
    assert sut.store.get_trajectory("t1") is None


async def test_state_written_before_a_restart_is_changed_after_it(sut: StoreUnderTest) -> None:
    sut.store.put_trajectory("t1", {"path_keys": ["a"], "num_moves": 0})
    sut.store.put_trajectory("t2", {"path_keys": ["b"], "num_moves": 0})
    store = await sut.reopen()  # a restarted scheduler reads what was written before
    read = store.get_trajectory("t1")
    assert read == {"path_keys": ["a"], "num_moves": 0}
    read["path_keys"].append("c")  # type: ignore[index]
    store.put_trajectory("t1", read)  # type: ignore[arg-type]
    assert store.get_trajectory("t2") == {"path_keys": ["b"], "num_moves": 0}
    store = await sut.reopen()
    assert store.get_trajectory("t1") == {"path_keys": ["a", "c"], "num_moves": 0}
    assert store.get_trajectory("t2") == {"path_keys": ["b"], "num_moves": 0}
    store.delete_trajectory("t2")  # it leaves the job: gone here and after a restart
    assert store.get_trajectory("t2") is None
    store = await sut.reopen()
    assert store.get_trajectory("t2") is None


# -- namespaced records -----------------------------------------------------------------


async def test_records_are_separate_per_namespace(sut: StoreUnderTest) -> None:
    sut.store.put_record("history", "p1", {"bucket": "long"})
    sut.store.put_record("scouts", "p1", {"bucket": "short"})
    store = await sut.reopen()
    assert store.get_record("history", "p1") == {"bucket": "long"}
    assert store.list_records("scouts") == {"p1": {"bucket": "short"}}
    assert store.list_records("empty") == {}


async def test_deleted_record_is_gone_after_reopen(sut: StoreUnderTest) -> None:
    sut.store.put_record("history", "p1", {"v": 1})
    sut.store.put_record("history", "p2", {"v": 2})
    store = await sut.reopen()
    store.delete_record("history", "p1")
    store.delete_record("history", "never-there")
    store = await sut.reopen()
    assert store.list_records("history") == {"p2": {"v": 2}}


# -- recent ring and tree ---------------------------------------------------------------


async def test_recent_ring_keeps_the_newest_oldest_first(sut: StoreUnderTest) -> None:
    for i in range(5):
        sut.store.append_recent({"i": i}, max_len=3)
    store = await sut.reopen()
    store.append_recent({"i": 5}, max_len=3)
    store = await sut.reopen()
    assert store.recent() == [{"i": 3}, {"i": 4}, {"i": 5}]


async def test_tree_snapshot_is_none_until_saved_then_replaced(sut: StoreUnderTest) -> None:
    assert sut.store.load_tree() is None
    sut.store.save_tree({"version": 1, "n": 1})
    sut.store.save_tree({"version": 1, "n": 2})
    store = await sut.reopen()
    assert store.load_tree() == {"version": 1, "n": 2}


# -- C-MLFQ over the store ---------------------------------------------------------------


# The reference's rules: entry in the shortest bucket and one visit is evidence, so the
# decision below is a certain move.
REFERENCE_RULES = CmlfqConfig(entry="shortest", disagree_rule="stay", live_thresholds=False,
                              min_node_visits=1, max_queue_length=0)


async def test_cmlfq_restored_from_the_store_has_the_same_tree_and_decisions(
        sut: StoreUnderTest) -> None:
    policy = CmlfqPolicy(make_layout(), sut.store, REFERENCE_RULES)
    teach(policy, "p1", 5_000, 3, "a")
    policy.on_step_end(1)  # snapshot
    teach(policy, "p2", 50, 2, "b")  # after the snapshot: replayed from the ring
    live = t.TrajectoryId("live")
    policy.begin(TrajectoryDescriptor(live, t.PromptId("p1")), INSTANCES)
    store = await sut.reopen()
    restored = CmlfqPolicy(make_layout(), store, REFERENCE_RULES)
    assert restored.restore() == "snapshot"
    assert restored.tree.to_dict() == policy.tree.to_dict()
    # The pinned trajectory survived too, and the decision is the one before restart.
    decision = restored.on_tool_return(live, FAIL, 10, INSTANCES)
    assert (decision.action.value, decision.to_bucket) == ("move", "long")


async def test_cmlfq_restored_from_the_store_derives_the_same_live_thresholds(
        sut: StoreUnderTest) -> None:
    config = CmlfqConfig(min_node_visits=1)  # Libra's live thresholds
    policy = CmlfqPolicy(make_layout(), sut.store, config)
    teach(policy, "p1", 5_000, 3, "a")
    policy.on_step_end(1)  # snapshot
    teach(policy, "p2", 50, 2, "b")  # after the snapshot: replayed from the ring
    store = await sut.reopen()
    restored = CmlfqPolicy(make_layout(), store, config)
    assert restored.restore() == "snapshot"
    assert restored.thresholds() == policy.thresholds()
    assert policy.thresholds()[1][0] != make_layout().buckets[0].max_tokens  # derived


# -- Redis specifics ----------------------------------------------------------------------


async def test_redis_keys_are_scoped_by_job_and_listed_for_cleanup(redis: Any) -> None:
    store = RedisPolicyStore(redis, JOB)
    store.put_trajectory("t1", {"x": 1})
    store.put_record("ns", "k", {"x": 1})
    store.append_recent({"x": 1}, 10)
    store.save_tree({"x": 1})
    await store.flush()
    other = RedisPolicyStore(redis, "job-2")
    await other.load()
    assert other.get_trajectory("t1") is None and other.recent() == []
    written = {k for k in await redis.keys("*")}
    assert written == {keys.sched_trajectories(JOB), keys.sched_records(JOB),
                       keys.sched_recent(JOB), keys.sched_tree(JOB)}
    assert written <= set(keys.job_keys(JOB))


async def test_redis_holds_the_json_of_the_last_put_before_each_flush(redis: Any) -> None:
    store = RedisPolicyStore(redis, JOB)
    store.put_trajectory("t1", {"path_keys": ["a"]})
    store.put_trajectory("t1", {"path_keys": ["a", "b"]})
    await store.flush()
    assert json.loads(await redis.hget(keys.sched_trajectories(JOB), "t1")) == {
        "path_keys": ["a", "b"]}
    fresh = RedisPolicyStore(redis, JOB)
    await fresh.load()
    assert fresh.get_trajectory("t1") == {"path_keys": ["a", "b"]}  # read: not dirty
    assert not fresh.is_dirty
    fresh.put_trajectory("t1", {"path_keys": ["c"]})
    await fresh.flush()
    assert json.loads(await redis.hget(keys.sched_trajectories(JOB), "t1")) == {
        "path_keys": ["c"]}


async def test_redis_flush_clears_dirty_and_unflushed_changes_are_not_visible(
        redis: Any) -> None:
    store = RedisPolicyStore(redis, JOB)
    store.put_trajectory("t1", {"x": 1})
    assert store.is_dirty
    other = RedisPolicyStore(redis, JOB)
    await other.load()
    assert other.get_trajectory("t1") is None  # write-behind: not yet in Redis
    await store.flush()
    assert not store.is_dirty
    await other.load()
    assert other.get_trajectory("t1") == {"x": 1}
