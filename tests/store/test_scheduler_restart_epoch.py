"""A rollout instance restarted under the same id within its lease TTL (a supervisor
or Kubernetes bringing it back before the old lease expired) takes a new lease epoch
without ever leaving the live set. The new process reads only new inbox entries, so
what was delivered to the old incarnation runs nowhere unless the scheduler re-queues
it: the epoch change in a lease snapshot must count as a departure. Run on both
scheduler stores (in memory, and Redis on the session's real redis-server)."""

from __future__ import annotations

import collections

import pytest

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from services.scheduler import requeue
from services.scheduler.core import SchedulerCore
from tests.store import test_scheduler_store_contract as contract
from tests.store.test_scheduler_store_contract import JOB, World
from tests.unit.scheduler.test_scheduler_core import make_spec

world = contract.world  # the fixture: both stores

SHORT = "short"


async def started(world: World) -> SchedulerCore:
    """A job of 6 groups of 2 (published weights) and its core on the world's store."""
    spec_json = make_spec(prompts=6, samples=2, cap=100).to_json()
    if world.redis is None:
        world.store.put_job(JOB, spec_json, published=True)
    else:
        await world.redis.hset(keys.job(JOB), mapping={"spec_json": spec_json,
                                                       "state": "running"})
        await world.redis.zadd(keys.JOBS_INDEX, {JOB: 1})
        await world.redis.hset(keys.policy(JOB), mapping={"version": 0})
    core = SchedulerCore(world.store, FakeClock())
    await core.start_job(JOB)
    return core


async def held_by(world: World, instance: str) -> set[str]:
    return {tid for tid, inst in (await world.store.assignments(JOB)).items()
            if inst == instance}


async def test_an_instance_restarted_under_a_new_epoch_has_its_former_work_requeued_once(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """ro-1 holds work under epoch 1; the next snapshot shows it under epoch 2 (never
    without it in between). Every trajectory it held is re-queued exactly once and
    placed again, it gets nothing new until the sweep ended, and loads keep counting
    the assignments (before the fix: nothing re-queued, the job wedged)."""
    monkeypatch.setattr(requeue, "ORPHAN_SCAN_PAGE", 3)  # the sweep takes several pages
    monkeypatch.setattr(requeue, "ORPHAN_SAFETY_PAGE", 1)
    for name in ("ro-0", "ro-1"):
        await world.lease(name, t.WorkerRole.CORE_ROLLOUT, SHORT, 1)
    core = await started(world)
    run = core._jobs[JOB]
    await core._tick(run)  # 12 placed over both; the first sweep is done
    former = await held_by(world, "ro-1")
    assert len(former) > 3  # more than one page of it
    await world.lease("ro-1", t.WorkerRole.CORE_ROLLOUT, SHORT, 2)  # restarted in the TTL
    for _ in range(10):
        await core._tick(run)
        assert await held_by(world, "ro-1") <= former  # nothing new while swept
        if not run.departed:
            break
    assert not run.departed
    assert not await held_by(world, "ro-1")  # the old incarnation's work all went back
    assigned = await world.store.assignments(JOB)
    assert former <= set(assigned)  # placed again (on ro-0), none lost
    assert (await world.store.counters(JOB))["requeued"] == len(former)  # once each
    for _ in range(3):  # later ticks and sweeps re-queue nothing more
        await core._tick(run)
    assert (await world.store.counters(JOB))["requeued"] == len(former)
    assert await world.store.assignments(JOB) == assigned
    loads = {inst: n for inst, n in (await world.load()).items() if n}
    assert loads == dict(collections.Counter(assigned.values()))
    assert "ro-1" in run.instances.ids  # the new incarnation is a target again


async def test_a_renewed_lease_under_the_same_epoch_requeues_nothing(world: World) -> None:
    """A snapshot repeating an instance's epoch (a renewal) is no restart."""
    await world.lease("ro-0", t.WorkerRole.CORE_ROLLOUT, SHORT, 3)
    core = await started(world)
    run = core._jobs[JOB]
    await core._tick(run)
    before = await world.store.assignments(JOB)
    assert before
    await world.lease("ro-0", t.WorkerRole.CORE_ROLLOUT, SHORT, 3)
    for _ in range(3):
        await core._tick(run)
    assert (await world.store.counters(JOB)).get("requeued", 0) == 0
    assert await world.store.assignments(JOB) == before
