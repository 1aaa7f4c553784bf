"""A rollout instance restarted (new lease epoch) while the scheduler was down.

A scheduler compares each snapshot's lease epochs with what it saw before; after its
own restart it saw nothing before. So the epoch under which it places an instance's
work is kept in the store (``placement_epochs``), and a starting scheduler compares the
first snapshot with that: an instance back under another epoch is departed, and what
its old incarnation held is re-queued once (it reads only new inbox entries, so that
work would run nowhere and the job would wedge). Run on both scheduler stores (in
memory, and Redis on the session's real redis-server)."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator

import pytest

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from services.scheduler import requeue
from services.scheduler.core import SchedulerCore
from tests.store import test_scheduler_store_contract as contract
from tests.store.test_scheduler_restart_epoch import SHORT, held_by, started
from tests.store.test_scheduler_store_contract import JOB, World

world = contract.world  # the fixture: both stores


async def restarted(world: World) -> SchedulerCore:
    """A new scheduler process on the same store (the old one's memory is gone)."""
    core = SchedulerCore(world.store, FakeClock())
    await core.start_job(JOB)
    return core


async def sweep_to_the_end(core: SchedulerCore, world: World, former: set[str]) -> None:
    """Ticks until the sweep ended; the departed instance gets nothing new meanwhile."""
    run = core._jobs[JOB]
    for _ in range(10):
        await core._tick(run)
        assert await held_by(world, "ro-1") <= former
        if not run.departed:
            return
    raise AssertionError(f"the sweep did not end: departed={run.departed}")


async def assert_requeued_once_and_placed_again(core: SchedulerCore, world: World,
                                                former: set[str]) -> None:
    assert not await held_by(world, "ro-1") & former  # the old incarnation's work went back
    assigned = await world.store.assignments(JOB)
    assert former <= set(assigned)  # placed again, none lost
    assert (await world.store.counters(JOB))["requeued"] == len(former)  # once each
    for _ in range(3):  # later ticks and sweeps re-queue nothing more
        await core._tick(core._jobs[JOB])
    assert (await world.store.counters(JOB))["requeued"] == len(former)
    assigned = await world.store.assignments(JOB)
    loads = {inst: n for inst, n in (await world.load()).items() if n}
    assert loads == dict(collections.Counter(assigned.values()))


@pytest.fixture
async def small_pages(world: World, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """A sweep takes several pages. On Redis, HSCAN returns a small hash (ziplist or
    listpack encoded, up to 128 fields) whole whatever the count: it is made a hash
    table here, so a count of 3 returns a few fields and a cursor past the start."""
    monkeypatch.setattr(requeue, "ORPHAN_SCAN_PAGE", 3)
    monkeypatch.setattr(requeue, "ORPHAN_SAFETY_PAGE", 1)
    if world.redis is None:
        yield
        return
    setting = "hash-max-ziplist-entries"  # listpack since Redis 7 (an alias)
    # One value, named as asked (Redis 6) or by its new name (Redis 7).
    [before] = (await world.redis.config_get(setting)).values()
    await world.redis.config_set(setting, 0)
    try:
        yield
    finally:
        await world.redis.config_set(setting, before)


async def two_instances_with_work(world: World) -> tuple[SchedulerCore, set[str]]:
    for name in ("ro-0", "ro-1"):
        await world.lease(name, t.WorkerRole.CORE_ROLLOUT, SHORT, 1)
    core = await started(world)
    await core._tick(core._jobs[JOB])  # 12 placed over both; the first sweep is done
    former = await held_by(world, "ro-1")
    assert len(former) > 3  # more than one page of it
    return core, former


async def test_an_instance_restarted_while_the_scheduler_was_down_has_its_work_requeued(
        world: World, small_pages: None) -> None:
    """Scheduler down; ro-1 restarts (epoch 1 -> 2); a new scheduler starts. It sees ro-1
    only under epoch 2, yet re-queues all ro-1 held, once (before the fix: nothing, the
    former work stayed assigned to an instance that never runs it)."""
    _core, former = await two_instances_with_work(world)
    await world.lease("ro-1", t.WorkerRole.CORE_ROLLOUT, SHORT, 2)  # while it is down
    core = await restarted(world)
    await sweep_to_the_end(core, world, former)
    await assert_requeued_once_and_placed_again(core, world, former)
    assert "ro-1" in core._jobs[JOB].instances.ids  # the new incarnation is a target again


async def test_a_scheduler_restart_alone_requeues_nothing(world: World,
                                                          small_pages: None) -> None:
    """The instances kept their epochs: a restarted scheduler leaves their work alone."""
    await two_instances_with_work(world)
    before = await world.store.assignments(JOB)
    core = await restarted(world)
    for _ in range(4):
        await core._tick(core._jobs[JOB])
    assert (await world.store.counters(JOB)).get("requeued", 0) == 0
    assert await world.store.assignments(JOB) == before


async def test_a_scheduler_that_dies_mid_sweep_leaves_the_next_one_to_finish_it(
        world: World, small_pages: None) -> None:
    """ro-1's lease lapses; the scheduler sweeps one page of its work and dies; ro-1
    comes back under a new epoch while no scheduler runs. The old epoch stays in the
    store until a sweep ended, so the next scheduler re-queues the rest."""
    core, former = await two_instances_with_work(world)
    await expire(world, "ro-1")
    await core._tick(core._jobs[JOB])  # one page of 3 re-queued, the sweep under way
    assert core._jobs[JOB].orphan_cursor
    assert await held_by(world, "ro-1")
    await world.lease("ro-1", t.WorkerRole.CORE_ROLLOUT, SHORT, 2)
    core = await restarted(world)
    await sweep_to_the_end(core, world, former)
    await assert_requeued_once_and_placed_again(core, world, former)


async def test_placement_epochs_are_read_as_written(world: World) -> None:
    """The store contract: set and delete by instance, per job."""
    assert await world.store.placement_epochs(JOB) == {}
    await world.store.update_placement_epochs(JOB, {"ro-0": 1, "ro-1": 4}, [])
    await world.store.update_placement_epochs(JOB, {"ro-1": 5}, ["ro-0"])
    assert await world.store.placement_epochs(JOB) == {"ro-1": 5}
    assert await world.store.placement_epochs("other") == {}
    if world.redis is not None:  # cleaned up with the job's keys
        assert keys.placement_epochs(JOB) in keys.job_keys(JOB)


async def expire(world: World, worker: str) -> None:
    if world.redis is None:
        world.store.expire_lease(worker)
        return
    await world.redis.delete(keys.lease(worker))
