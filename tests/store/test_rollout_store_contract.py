"""The rollout store's contract, run against both implementations (``world``): the Redis
store on a real Redis and the in-memory store. Publishing and handing off are fenced by
the lease epoch (and a handoff by the assignment), atomic and idempotent where promised."""

from __future__ import annotations

import asyncio

import pytest

from libra import redis_keys as keys
from libra import types as t
from tests.store.rollout_worlds import MemoryWorld, RedisWorld

JOB, HERE, THERE = "job-1", "ro-1", "ro-2"

World = RedisWorld | MemoryWorld


@pytest.fixture(params=["redis", "memory"])
def world(request: pytest.FixtureRequest) -> World:
    if request.param == "redis":
        return RedisWorld(request.getfixturevalue("redis_bytes"))
    return MemoryWorld()


def task(index: int = 0, status: t.TrajectoryStatus = t.TrajectoryStatus.RUNNING,
         eval_round: int = 0) -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId(f"tr-{index}"), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", status=status, eval_round=eval_round)


def finished(index: int = 0) -> t.Trajectory:
    return task(index, t.TrajectoryStatus.FINISHED)


async def inbox_entry(world: World, traj: t.Trajectory | None = None,
                      assign: bool = False) -> str:
    await world.store.ensure_inbox(HERE)
    await world.place(traj or task(), HERE, assign=assign)
    (entry,) = await world.store.read_inbox(HERE, 1, 0)
    return entry.entry_id


async def test_publish_at_the_current_epoch_appends_acks_and_counts(world: World) -> None:
    await world.set_lease_epoch(HERE, 4)
    entry_id = await inbox_entry(world)
    assert await world.store.publish(finished(), HERE, entry_id, 4)
    ((entry),) = await world.published(JOB)
    assert (entry.trajectory.trajectory_id, entry.status, entry.instance_id) == (
        "tr-0", "finished", HERE)
    assert await world.inbox_size(HERE) == 0
    assert await world.counters(JOB) == {"produced": 1}


async def test_publish_counts_failed_and_eval_trajectories_apart(world: World) -> None:
    await world.set_lease_epoch(HERE, 1)
    assert await world.store.publish(task(0, t.TrajectoryStatus.FAILED), HERE,
                                     await inbox_entry(world), 1)
    assert await world.store.publish(task(1, t.TrajectoryStatus.FINISHED, eval_round=1),
                                     HERE, await inbox_entry(world), 1)
    assert await world.counters(JOB) == {"failed": 1, "eval_produced": 1}


async def test_publish_at_a_stale_epoch_writes_nothing(world: World) -> None:
    await world.set_lease_epoch(HERE, 5)
    entry_id = await inbox_entry(world)
    assert not await world.store.publish(finished(), HERE, entry_id, 4)
    assert await world.published(JOB) == []
    assert await world.inbox_size(HERE) == 1  # still pending: re-placeable
    assert await world.counters(JOB) == {}


async def test_publish_without_a_lease_writes_nothing(world: World) -> None:
    entry_id = await inbox_entry(world)
    assert not await world.store.publish(finished(), HERE, entry_id, 1)
    assert await world.published(JOB) == []


async def test_a_repeat_publish_of_a_trajectory_is_counted_not_appended(
        world: World) -> None:
    # The first try was applied but its reply lost (Redis restarted): the retry must not
    # make the trainer see the trajectory twice, nor count it produced twice.
    await world.set_lease_epoch(HERE, 4)
    assert await world.store.publish(finished(), HERE, await inbox_entry(world), 4)
    assert await world.store.publish(finished(), HERE, await inbox_entry(world), 4)
    assert len(await world.published(JOB)) == 1
    assert await world.inbox_size(HERE) == 0  # the repeat's entry is acked too
    assert await world.counters(JOB) == {"produced": 1, "duplicate_publishes": 1}


async def test_read_inbox_delivers_each_entry_once_up_to_count(world: World) -> None:
    await world.store.ensure_inbox(HERE)
    for index in range(3):
        await world.place(task(index), HERE)
    first = await world.store.read_inbox(HERE, 2, 0)
    rest = await world.store.read_inbox(HERE, 5, 0)
    assert [e.trajectory.trajectory_id for e in first + rest] == ["tr-0", "tr-1", "tr-2"]
    assert all(e.job_id == JOB for e in first + rest)
    assert await world.store.read_inbox(HERE, 5, 0) == []
    assert await world.inbox_size(HERE) == 3  # read, not acked


async def test_a_deleted_inbox_is_recreated_empty_and_then_delivers(world: World) -> None:
    await world.store.ensure_inbox(HERE)
    await world.drop_inbox(HERE)
    assert await world.store.read_inbox(HERE, 5, 0) == []  # NOGROUP: recreated
    await world.place(task(), HERE)
    (entry,) = await world.store.read_inbox(HERE, 5, 0)
    assert entry.trajectory.trajectory_id == "tr-0"


async def test_a_restarted_incarnation_reads_only_new_entries_and_the_old_is_fenced(
        world: World) -> None:
    """The same instance id restarted within its lease TTL (a new epoch): what the old
    incarnation was delivered is never delivered again (the scheduler re-queues it on
    the epoch change, so it runs once), and the old epoch's publish is refused."""
    await world.set_lease_epoch(HERE, 1)
    old_entry = await inbox_entry(world)  # delivered to the old one, never acked
    await world.set_lease_epoch(HERE, 2)  # the new incarnation's lease
    await world.store.ensure_inbox(HERE)  # its start-up
    await world.place(task(1), HERE)
    assert [e.trajectory.trajectory_id
            for e in await world.store.read_inbox(HERE, 5, 0)] == ["tr-1"]
    assert not await world.store.publish(finished(), HERE, old_entry, 1)
    assert await world.published(JOB) == []


async def test_ack_and_clear_inbox_remove_entries(world: World) -> None:
    entry_id = await inbox_entry(world)
    await world.place(task(1), HERE)
    await world.store.ack(HERE, entry_id)
    assert await world.inbox_size(HERE) == 1
    await world.store.clear_inbox(HERE)
    assert await world.inbox_size(HERE) == 0
    assert await world.store.read_inbox(HERE, 5, 0) == []


async def test_handoff_moves_the_trajectory_and_commits_the_move(world: World) -> None:
    await world.set_lease_epoch(HERE, 2)
    traj = task()
    entry_id = await inbox_entry(world, traj, assign=True)
    traj.num_migrations = 1
    assert await world.store.handoff(traj, HERE, entry_id, THERE, "long", 2)
    ((job_id, moved),) = await world.inbox_tasks(THERE)
    assert job_id == JOB
    assert moved.num_migrations == 1
    assert (await world.task(JOB, "tr-0")).num_migrations == 1
    assert await world.inbox_size(HERE) == 0
    assert await world.assignment(JOB, "tr-0") == THERE
    assert await world.load(JOB) == {HERE: 0, THERE: 1}
    assert await world.counters(JOB) == {"migrations": 1, keys.placed_counter("long"): 1}


@pytest.mark.parametrize("fence", ["stale epoch", "no lease", "re-assigned"])
async def test_a_fenced_handoff_writes_nothing(world: World, fence: str) -> None:
    if fence != "no lease":
        await world.set_lease_epoch(HERE, 3 if fence == "stale epoch" else 2)
    entry_id = await inbox_entry(world, task(), assign=fence != "re-assigned")
    assert not await world.store.handoff(task(), HERE, entry_id, THERE, "long", 2)
    assert await world.inbox_size(THERE) == 0 and await world.inbox_size(HERE) == 1
    assert await world.counters(JOB) == {}
    expected = {} if fence == "re-assigned" else {HERE: 1}
    assert await world.load(JOB) == expected


async def test_hand_back_leaves_the_latest_state_and_acks(world: World) -> None:
    traj = task()
    entry_id = await inbox_entry(world, traj)
    traj.token_ids = [1, 2, 3]
    await world.store.hand_back(traj, HERE, entry_id)
    assert (await world.task(JOB, "tr-0")).token_ids == [1, 2, 3]
    assert await world.inbox_size(HERE) == 0


async def test_job_record_policy_events_and_weights_in_use(world: World) -> None:
    assert await world.store.job_spec_json(JOB) is None
    assert await world.store.job_state(JOB) is None
    assert await world.store.policy(JOB) is None
    await world.put_job(JOB, '{"x": 1}', "running")
    policy = t.PolicyInfo(3, "/w/v3.safetensors", "ab" * 32, "/m", 7)
    await world.set_policy(JOB, policy)
    assert await world.store.job_spec_json(JOB) == '{"x": 1}'
    assert await world.store.job_state(JOB) == "running"
    assert await world.store.policy(JOB) == policy
    await world.store.record_event(JOB, "weights_loaded", version="3")
    await world.store.record_event(JOB, "other")
    assert await world.events(JOB, "weights_loaded") == [{"kind": "weights_loaded",
                                                           "version": "3"}]
    await world.store.report_weights(JOB, HERE, 2, 3)
    await world.store.report_weights(JOB, THERE, 3, -1)
    await world.store.leave_weights(JOB, THERE)
    assert await world.weights_in_use(JOB) == {HERE: "2 3"}


async def test_a_blocking_read_returns_what_is_placed_meanwhile(world: World) -> None:
    await world.store.ensure_inbox(HERE)
    assert await world.store.read_inbox(HERE, 5, 1) == []  # nothing placed: empty
    reader = asyncio.create_task(world.store.read_inbox(HERE, 5, 10_000))
    await asyncio.sleep(0)  # the reader is blocked on the empty inbox
    await world.place(task(), HERE)
    (entry,) = await asyncio.wait_for(reader, 10.0)
    assert entry.trajectory.trajectory_id == "tr-0"
