"""What keeps a scheduler tick bounded at 1,000 instances and 100,000 trajectories in
flight (benchmarks/bench_control_plane.py measures it): placements per tick, the orphan
sweep by pages, load changes by index, routing in one pass."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import random

import pytest

from libra import types as t
from libra.clock import FakeClock
from scheduling.policy.layout import BucketLayout
from scheduling.policy.routing import RoundRobinCursor, RouteKind, RouteResult, route_by_load
from scheduling.policy.thresholds import live_gpu_shares
from services.scheduler import requeue
from services.scheduler.core import MAX_PLACED_PER_TICK, ORPHAN_SCAN_S, SchedulerCore
from services.scheduler.job_run import apply_local_load
from services.scheduler.memory_store import MemorySchedulerStore
from tests.unit.scheduler.test_scheduler_core import JOB, add_instance, counters, make_spec


async def started(store: MemorySchedulerStore, clock: FakeClock, **spec: int) -> SchedulerCore:
    store.put_job(JOB, make_spec(**spec).to_json(), published=True)
    core = SchedulerCore(store, clock)
    await core.start_job(JOB)
    return core


async def test_a_tick_places_a_bounded_number_and_the_next_tick_goes_on() -> None:
    store, clock = MemorySchedulerStore(), FakeClock()
    for i in range(4):
        await add_instance(store, f"rollout-{i}", "short")
    # A budget of 2 x 300 groups of 2 = 1,200 trajectories, room for all of them.
    core = await started(store, clock, prompts=300, samples=2, staleness=1, cap=1000)
    await core._tick(core._jobs[JOB])
    first = await counters(store)
    assert first["admitted"] == MAX_PLACED_PER_TICK
    await core._tick(core._jobs[JOB])
    assert (await counters(store))["admitted"] == 2 * MAX_PLACED_PER_TICK
    for _ in range(1200 // MAX_PLACED_PER_TICK):
        await core._tick(core._jobs[JOB])
    assert (await counters(store))["admitted_groups"] == 600  # the whole budget, in time
    assert len(await store.assignments(JOB)) == 1200


async def test_a_tick_stopped_at_the_bound_is_followed_at_once_not_a_period_later() -> None:
    """The fill: a loop whose tick placed MAX_PLACED_PER_TICK with more to place runs
    the next one as soon as waiting reports were served. With an hour's period, only
    that can place more than one tick's worth; once everything is placed it waits."""
    store, clock = MemorySchedulerStore(), FakeClock()
    for i in range(4):
        await add_instance(store, f"rollout-{i}", "short")
    store.put_job(JOB, make_spec(prompts=300, samples=2, staleness=1, cap=1000).to_json(),
                  published=True)
    core = SchedulerCore(store, clock, tick_s=3600.0)
    await core.start_job(JOB)  # its dataset opens on a thread: not counted in turns
    loop = asyncio.create_task(core.run())
    try:
        for _ in range(1000):  # event-loop turns, not time
            await asyncio.sleep(0)
            if (await counters(store)).get("admitted_groups", 0) == 600:
                break
        assert (await counters(store))["admitted_groups"] == 600  # the whole budget
        assert len(await store.assignments(JOB)) == 1200
    finally:
        await core.drain(0.0)
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


async def test_the_pending_queue_is_placed_a_bounded_number_per_tick() -> None:
    store, clock = MemorySchedulerStore(), FakeClock()
    await add_instance(store, "rollout-0", "short")
    core = await started(store, clock, prompts=300, samples=2, staleness=1, cap=1000)
    for _ in range(1000 // MAX_PLACED_PER_TICK + 1):
        await core._tick(core._jobs[JOB])
    on_first, queued = len(await store.assignments(JOB)), len(await store.pending(JOB))
    assert on_first == 1000  # the cap; one group waits beyond it
    store.expire_lease("rollout-0")  # everything goes back to the queue
    await core._tick(core._jobs[JOB])
    assert len(await store.pending(JOB)) == on_first + queued
    await add_instance(store, "rollout-1", "short")
    await core._tick(core._jobs[JOB])
    assert len(await store.assignments(JOB)) == MAX_PLACED_PER_TICK


async def test_an_orphan_behind_an_unchanged_set_of_instances_is_found_by_the_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An assignment to an instance the scheduler never saw live (a handoff racing a
    lease loss) is re-queued by the periodic sweep, a small page per tick."""
    monkeypatch.setattr(requeue, "ORPHAN_SCAN_PAGE", 100)  # not this sweep's
    monkeypatch.setattr(requeue, "ORPHAN_SAFETY_PAGE", 3)
    store, clock = MemorySchedulerStore(), FakeClock()
    await add_instance(store, "rollout-0", "short")
    core = await started(store, clock, prompts=4, samples=2, cap=100)
    await core._tick(core._jobs[JOB])  # 8 placed; the first tick scans them all
    store.put_assignment(JOB, "handed-off", "rollout-gone")
    await core._tick(core._jobs[JOB])
    assert (await counters(store)).get("requeued", 0) == 0  # no sweep due yet
    clock.advance(ORPHAN_SCAN_S)
    ticks = 0
    while (await counters(store)).get("requeued", 0) == 0:
        await core._tick(core._jobs[JOB])
        ticks += 1
        assert ticks <= 3  # 9 assignments, 3 a page
    assert ticks == 3  # the orphan was added last: the third page
    assert (await store.assignments(JOB)).get("handed-off") == "rollout-0"  # re-placed


async def test_an_instance_leaving_restarts_the_sweep_a_page_per_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease that lapsed re-queues its instance's work through a sweep restarted at
    once, a page per tick: never one read of every assignment (100,000 at 1,000
    instances, at every lapse)."""
    monkeypatch.setattr(requeue, "ORPHAN_SCAN_PAGE", 3)
    monkeypatch.setattr(requeue, "ORPHAN_SAFETY_PAGE", 1)  # not this sweep's
    store, clock = MemorySchedulerStore(), FakeClock()
    for name in ("rollout-0", "rollout-1"):
        await add_instance(store, name, "short")
    core = await started(store, clock, prompts=4, samples=2, cap=100)
    await core._tick(core._jobs[JOB])  # 8 placed over both; the first sweep is done
    lost = [tid for tid, inst in (await store.assignments(JOB)).items() if inst == "rollout-1"]
    assert 0 < len(lost) < 8
    store.expire_lease("rollout-1")  # within ORPHAN_SCAN_S of the last sweep
    await core._tick(core._jobs[JOB])
    assert 0 < (await counters(store))["requeued"] <= 3  # this tick: page one alone
    for _ in range(2):  # 8 assignments, 3 a page
        await core._tick(core._jobs[JOB])
    assert (await counters(store))["requeued"] == len(lost)
    assert set((await store.assignments(JOB)).values()) == {"rollout-0"}


async def test_an_instance_back_before_the_sweep_ended_has_all_its_former_work_requeued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease lapses and the instance is back (a new epoch) while the sweep has read
    one page: it dropped its work with the lease, so every page re-queues what it
    held, it gets no placement until the sweep ended, and every instance's load keeps
    counting its assignments (the former sweep forgot the load at the first page and
    left the later pages' work assigned to it: filled past its cap, work stuck)."""
    monkeypatch.setattr(requeue, "ORPHAN_SCAN_PAGE", 3)
    monkeypatch.setattr(requeue, "ORPHAN_SAFETY_PAGE", 1)
    store, clock = MemorySchedulerStore(), FakeClock()
    for name in ("rollout-0", "rollout-1"):
        await add_instance(store, name, "short")
    core = await started(store, clock, prompts=6, samples=2, cap=100)
    run = core._jobs[JOB]
    await core._tick(run)  # 12 placed over both; the first sweep is done
    former = {tid for tid, inst in (await store.assignments(JOB)).items()
              if inst == "rollout-1"}
    assert len(former) > 3  # more than one page of it
    store.expire_lease("rollout-1")
    await core._tick(run)  # gone: the sweep restarts, one page
    await add_instance(store, "rollout-1", "short", epoch=2)  # back with a new lease
    for _ in range(10):
        await core._tick(run)
        held = {tid for tid, inst in (await store.assignments(JOB)).items()
                if inst == "rollout-1"}
        assert held <= former  # nothing new for it while its work is swept
        if not run.departed:
            break
    assert not run.departed and not held  # every former trajectory of it re-queued
    loads = {inst: n for inst, n in store.load(JOB).items() if n}
    assert loads == dict(collections.Counter((await store.assignments(JOB)).values()))
    assert "rollout-1" not in run.instances.ids
    await core._tick(run)  # the sweep over, it is a placement target again
    assert "rollout-1" in run.instances.ids


async def test_load_changes_follow_the_snapshot_they_are_given() -> None:
    store, clock = MemorySchedulerStore(), FakeClock()
    run = (await started(store, clock, prompts=1, samples=2, staleness=1, cap=1))._jobs[JOB]
    first = [t.InstanceLoad(t.InstanceId(f"r-{i}"), "short", 0) for i in range(3)]
    run.set_instances(first, 1.0)
    apply_local_load(run, (("r-1", 2), ("r-unknown", 5)))
    assert [inst.active_trajectories for inst in first] == [0, 2, 0]
    second = [t.InstanceLoad(t.InstanceId("r-1"), "short", 7)]  # a new snapshot
    run.set_instances(second, 2.0)
    apply_local_load(run, (("r-1", -1),))
    assert second[0].active_trajectories == 6 and first[1].active_trajectories == 2
    assert list(run.instances) == second and run.instances_at_s == 2.0


async def test_a_snapshot_of_the_same_instances_moves_only_the_loads_that_changed() -> None:
    """The lease snapshot (every 0.25 s) of an unchanged fleet updates the index in
    place, O(changes); a fleet that changed gets a new index."""
    store, clock = MemorySchedulerStore(), FakeClock()
    run = (await started(store, clock, prompts=1, samples=2, staleness=1, cap=4))._jobs[JOB]
    run.set_instances([t.InstanceLoad(t.InstanceId(f"r-{i}"), "short", 0) for i in range(3)],
                      1.0)
    index = run.instances
    run.set_instances([t.InstanceLoad(t.InstanceId(f"r-{i}"), "short", 4 if i == 1 else 0)
                       for i in range(3)], 2.0)
    assert run.instances is index and run.instances_at_s == 2.0
    assert [inst.active_trajectories for inst in run.instances] == [0, 4, 0]
    assert list(index.ids_at("short", 0)) == ["r-0", "r-2"]  # r-1 is full (cap 4)
    moved = [t.InstanceLoad(t.InstanceId("r-0"), "long", 0),
             t.InstanceLoad(t.InstanceId("r-1"), "short", 0),
             t.InstanceLoad(t.InstanceId("r-2"), "short", 0)]
    run.set_instances(moved, 3.0)  # a bucket changed: a new index
    assert run.instances is not index and list(run.instances) == moved


def _route_by_load_reference(instances: list[t.InstanceLoad], layout: BucketLayout,
                             cursor: RoundRobinCursor) -> RouteResult | None:
    """The former five-pass route_by_load, kept as the specification of the one pass."""
    caps = {b.name: b.max_trajectories_per_instance for b in layout.buckets}
    tp = {b.name: b.tp_degree for b in layout.buckets}
    candidates = [i for i in instances if i.bucket in caps and i.is_live
                  and i.active_trajectories < caps[i.bucket]]
    if not candidates:
        return None
    least = min(i.active_trajectories / tp[i.bucket] for i in candidates)
    tied = [i for i in candidates if i.active_trajectories / tp[i.bucket] == least]
    level = min(layout.index(i.bucket) for i in tied)
    name = layout.buckets[level].name
    ids = sorted(i.instance_id for i in tied if i.bucket == name)
    chosen = ids[0] if len(ids) == 1 else cursor.pick(name, ids)  # one: the cursor stays
    return RouteResult(chosen, name, RouteKind.PREFERRED)


def test_routing_by_load_in_one_pass_chooses_as_before() -> None:
    layout = BucketLayout([
        t.Bucket("short", 1_000, max_trajectories_per_instance=4, tp_degree=1),
        t.Bucket("mid", 4_000, max_trajectories_per_instance=6, tp_degree=2),
        t.Bucket("long", 16_000, max_trajectories_per_instance=8, tp_degree=4)])
    rng = random.Random(7)
    fast, slow = RoundRobinCursor(), RoundRobinCursor()
    for trial in range(400):
        instances = [t.InstanceLoad(t.InstanceId(f"r-{i:02d}"),
                                    rng.choice(["short", "mid", "long", "gone"]),
                                    rng.randint(0, 8), is_live=rng.random() > 0.1)
                     for i in range(rng.randint(0, 12))]
        expected = _route_by_load_reference(instances, layout, slow)
        assert route_by_load(instances, layout, cursor=fast) == expected, trial


def test_live_gpu_shares_count_live_instances_of_known_buckets() -> None:
    layout = BucketLayout([t.Bucket("short", 1_000, tp_degree=1),
                           t.Bucket("long", 16_000, tp_degree=4)])
    loads = [t.InstanceLoad(t.InstanceId(f"r-{i}"), bucket, 0, is_live=live)
             for i, (bucket, live) in enumerate(itertools.product(
                 ["long", "short", "gone"], [True, False]))]
    assert live_gpu_shares(layout, loads) == {"short": 1, "long": 4}
    assert live_gpu_shares(layout, loads[1:2]) == {"short": 1, "long": 4}  # none live
