"""One contract suite for the scheduler's store, run against both implementations:
``RedisSchedulerStore`` on a real Redis and ``MemorySchedulerStore`` (core unit tests,
one-process loop). What other services write (job record, leases, finishes) goes
through a small per-backend ``World``: Redis keys on one side, the memory store's own
methods on the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from libra import redis_keys as keys
from libra import types as t
from libra.evaluation import EVAL_ROUNDS_COUNTER, eval_size_counter
from libra.wire.common import encode_trajectory
from services.scheduler.memory_store import MemorySchedulerStore
from services.scheduler.state import TickWrites
from services.scheduler.store import RedisSchedulerStore

JOB = "job-1"


@dataclass
class World:
    store: Any
    redis: Any = None  # the Redis side's client; None for the memory store

    async def job(self, state: str = "running", step: int = 0) -> None:
        if self.redis is None:
            self.store.put_job(JOB, '{"name": "t"}', state=state)
            self.store.set_job_step(JOB, step)
            return
        await self.redis.hset(keys.job(JOB), mapping={"spec_json": '{"name": "t"}',
                                                      "state": state, "step": step})
        await self.redis.zadd(keys.JOBS_INDEX, {JOB: 1})
        await self.redis.hset(keys.policy(JOB), mapping={"version": 0})

    async def lease(self, worker: str, role: t.WorkerRole, bucket: str, epoch: int) -> None:
        if self.redis is None:
            self.store.grant_lease(worker, role, bucket, epoch)
            return
        await self.redis.sadd(keys.WORKERS, worker)
        await self.redis.hset(keys.lease(worker), mapping={
            "role": role.value, "bucket": bucket, "epoch": epoch})

    async def finish(self, traj_id: str, total_tokens: int) -> None:
        if self.redis is None:
            self.store.add_finish(JOB, traj_id, total_tokens)
            return
        await self.redis.xadd(keys.trajectories(JOB), {
            "trajectory_id": traj_id, "total_tokens": total_tokens, "status": "finished",
            "data": encode_trajectory(traj(traj_id))})

    async def load(self) -> dict[str, int]:
        if self.redis is None:
            return self.store.load(JOB)
        raw = await self.redis.hgetall(keys.load(JOB))
        return {k.decode(): int(v) for k, v in raw.items()}

    async def inbox_size(self, instance: str) -> int:
        if self.redis is None:
            return len(self.store.inbox(instance))
        return await self.redis.xlen(keys.inbox(instance))


@pytest.fixture(params=["memory", "redis"])
def world(request: pytest.FixtureRequest) -> World:
    if request.param == "memory":
        return World(MemorySchedulerStore())
    redis = request.getfixturevalue("redis_bytes")
    return World(RedisSchedulerStore(redis), redis)


def traj(traj_id: str, instance: str = "", bucket: str = "short") -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId(traj_id), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", instance_id=instance, bucket=bucket)


async def placed(world: World, *traj_ids: str, instance: str = "ro-0") -> None:
    policy = await world.store.open_policy_store(JOB)
    await world.store.commit_tick(JOB, TickWrites(
        placed=[traj(tid, instance) for tid in traj_ids], num_groups=1), policy)


async def test_job_record_is_read_as_written(world: World) -> None:
    assert await world.store.job_spec_json(JOB) is None
    await world.job(step=3)
    assert (await world.store.job_spec_json(JOB), await world.store.job_state(JOB),
            await world.store.job_step(JOB)) == ('{"name": "t"}', "running", 3)
    assert await world.store.running_jobs() == [JOB]


async def test_a_ticks_placements_and_admissions_commit_together(world: World) -> None:
    await world.job()
    policy = await world.store.open_policy_store(JOB)
    policy.put_record("ns", "k", {"v": 1})
    await world.store.commit_tick(JOB, TickWrites(
        placed=[traj("a", "ro-0"), traj("b", "ro-0")], queued=[traj("c")], num_groups=2,
        eval_round=1, eval_size=4), policy)
    assert await world.store.assignments(JOB) == {"a": "ro-0", "b": "ro-0"}
    assert (await world.store.task(JOB, "a")).instance_id == "ro-0"
    assert [tr.trajectory_id for tr in await world.store.pending(JOB)] == ["c"]
    assert await world.load() == {"ro-0": 2}
    assert await world.inbox_size("ro-0") == 2
    counters = await world.store.counters(JOB)
    assert (counters["admitted_groups"], counters["admitted"]) == (2, 3)
    assert counters[keys.placed_counter("short")] == 2
    assert (counters[EVAL_ROUNDS_COUNTER], counters[eval_size_counter(1)]) == (1, 4)
    reopened = await world.store.open_policy_store(JOB)
    assert reopened.get_record("ns", "k") == {"v": 1}


async def test_placing_from_the_queue_removes_it_from_the_queue(world: World) -> None:
    await world.job()
    policy = await world.store.open_policy_store(JOB)
    await world.store.commit_tick(JOB, TickWrites(queued=[traj("c")], num_groups=1), policy)
    await world.store.commit_tick(JOB, TickWrites(
        placed_from_pending=[traj("c", "ro-1", "long")]), policy)
    assert await world.store.pending(JOB) == []
    assert await world.store.assignments(JOB) == {"c": "ro-1"}


async def test_unflushed_policy_changes_are_lost_on_reopen(world: World) -> None:
    await world.job()
    policy = await world.store.open_policy_store(JOB)
    policy.put_trajectory("a", {"x": 1})
    await world.store.commit_tick(JOB, TickWrites(), policy)
    policy.put_trajectory("b", {"x": 2})  # never flushed: a crash loses it
    reopened = await world.store.open_policy_store(JOB)
    assert (reopened.get_trajectory("a"), reopened.get_trajectory("b")) == ({"x": 1}, None)


async def test_release_gives_a_slot_back_once(world: World) -> None:
    await world.job()
    await placed(world, "a", "b")
    assert await world.store.release(JOB, "a") == "ro-0"
    assert await world.store.release(JOB, "a") is None
    assert await world.load() == {"ro-0": 1}
    assert await world.store.task(JOB, "a") is None


async def test_requeue_moves_a_trajectory_back_to_the_queue(world: World) -> None:
    await world.job()
    await placed(world, "a")
    moved = traj("a")
    moved.attempt = 1
    assert await world.store.requeue(JOB, moved)
    assert await world.store.assignments(JOB) == {}
    assert await world.load() == {"ro-0": 0}  # its slot given back
    assert [(tr.trajectory_id, tr.attempt) for tr in await world.store.pending(JOB)] \
        == [("a", 1)]
    assert (await world.store.counters(JOB))["requeued"] == 1


async def test_requeue_many_gives_slots_back_and_skips_the_finished(world: World) -> None:
    """An instance's work re-queued a page at a time keeps its load equal to what is
    still assigned to it; a trajectory finished meanwhile is not re-queued."""
    await world.job()
    await placed(world, "a", "b", "c")
    assert await world.store.release(JOB, "c") == "ro-0"  # finished meanwhile
    first = await world.store.requeue_many(JOB, [traj("a")])
    assert (first, await world.load()) == (["a"], {"ro-0": 1})  # b still there
    assert await world.store.requeue_many(JOB, [traj("b"), traj("c")]) == ["b"]
    assert await world.load() == {"ro-0": 0}
    assert sorted(tr.trajectory_id for tr in await world.store.pending(JOB)) == ["a", "b"]
    assert (await world.store.counters(JOB))["requeued"] == 2


async def test_finish_forgets_without_touching_the_load(world: World) -> None:
    await world.job()
    await placed(world, "a")
    assert await world.store.finish(JOB, "a") == "ro-0"
    assert await world.store.finish(JOB, "a") is None
    assert await world.load() == {"ro-0": 1}


async def test_a_tick_reads_finishes_once_and_gives_their_slots_back(world: World) -> None:
    await world.job(step=2)
    await world.store.ensure_finish_group(JOB)
    await placed(world, "a")
    await world.finish("a", 40)
    await world.finish("gone", 7)  # not assigned (re-queued meanwhile): nothing released
    state = await world.store.tick_state(JOB, ">", 16)
    assert (state.state, state.step, state.published) == ("running", 2, True)
    assert [(f.trajectory_id, f.total_tokens, f.status, f.released_from)
            for f in state.finishes] == [("a", 40, t.TrajectoryStatus.FINISHED, "ro-0"),
                                         ("gone", 7, t.TrajectoryStatus.FINISHED, None)]
    assert await world.load() == {"ro-0": 0}
    assert (await world.store.tick_state(JOB, ">", 16)).finishes == []
    assert (await world.store.tick_state(JOB, "0", 16)).finishes == []  # all acked


async def test_a_tick_takes_at_most_max_finishes(world: World) -> None:
    await world.job()
    await world.store.ensure_finish_group(JOB)
    for tid in ("a", "b", "c"):
        await world.finish(tid, 1)
    first = await world.store.tick_state(JOB, ">", 2)
    second = await world.store.tick_state(JOB, ">", 2)
    assert [f.trajectory_id for f in first.finishes + second.finishes] == ["a", "b", "c"]
    assert len(first.finishes) == 2


async def test_lease_snapshot_places_on_rollout_roles_and_fences_every_role(
        world: World) -> None:
    await world.job()
    await placed(world, "a", instance="ro-1")
    await world.lease("ro-1", t.WorkerRole.CORE_ROLLOUT, "short", 3)
    await world.lease("ro-0", t.WorkerRole.HYBRID_ROLLOUT, "long", 5)
    await world.lease("tr-0", t.WorkerRole.HYBRID_TRAINING, "long", 7)
    snapshot = await world.store.lease_snapshot(JOB)
    assert snapshot.instances == [t.InstanceLoad(t.InstanceId("ro-0"), "long", 0),
                                  t.InstanceLoad(t.InstanceId("ro-1"), "short", 1)]
    assert snapshot.epochs == {"ro-0": 5, "ro-1": 3, "tr-0": 7}
    assert (await world.store.tick_state(JOB, ">", 1, with_leases=True)).leases == snapshot
    assert (await world.store.tick_state(JOB, ">", 1)).leases is None
    assert [i.active_trajectories for i in (await world.store.lease_snapshot("")).instances] \
        == [0, 0]  # no job: epochs only, no load read


async def test_forget_instances_and_clear_load(world: World) -> None:
    await world.job()
    await placed(world, "a", instance="ro-0")
    await placed(world, "b", instance="ro-1")
    await placed(world, "c", instance="ro-2")
    await world.store.forget_instances(JOB, [])  # nothing to drop
    await world.store.forget_instances(JOB, ["ro-0", "ro-2", "ro-9"])  # ro-9: no inbox
    # The inboxes go; the load still counts the assignments, which are re-queued later
    # (their re-queue gives the slots back).
    assert (await world.load(), [await world.inbox_size(i) for i in ("ro-0", "ro-1", "ro-2")]) \
        == ({"ro-0": 1, "ro-1": 1, "ro-2": 1}, [0, 1, 0])
    assert await world.store.assignments(JOB) == {"a": "ro-0", "b": "ro-1", "c": "ro-2"}
    await world.store.clear_load(JOB)
    assert await world.load() == {}


async def test_counters_add_up(world: World) -> None:
    await world.store.incr_counters(JOB, trained_groups=2, dropped_groups=1)
    await world.store.incr_counters(JOB, trained_groups=3)
    assert await world.store.counters(JOB) == {"trained_groups": 5, "dropped_groups": 1}


async def test_a_job_not_running_is_not_listed(world: World) -> None:
    await world.job(state="cancelled")
    assert await world.store.running_jobs() == []
    assert (await world.store.tick_state(JOB, ">", 1)).state == "cancelled"


def test_both_stores_have_every_method_of_the_protocol_with_its_signature() -> None:
    import inspect

    from services.scheduler.store_protocol import SchedulerStore

    for name, method in inspect.getmembers(SchedulerStore, inspect.isfunction):
        if name.startswith("_"):
            continue
        for impl in (MemorySchedulerStore, RedisSchedulerStore):
            params = list(inspect.signature(getattr(impl, name)).parameters)
            assert params == list(inspect.signature(method).parameters), (impl, name)
