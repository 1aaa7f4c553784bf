"""SchedulerCore on the in-memory store: admission budget, placement, re-queue, restart
(the Redis store is held to the same contract in tests/store)."""

from __future__ import annotations

import json

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import JobSpec, job_spec_from_dict
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore

JOB = "job-1"


def make_spec(policy: str = "least_loaded", prompts: int = 2, samples: int = 2,
              staleness: int = 0, cap: int = 16) -> JobSpec:
    return job_spec_from_dict({
        "name": "t", "algorithm": {"prompts_per_step": prompts, "samples_per_prompt": samples,
                                   "max_staleness": staleness},
        "layout": {"policy": policy, "buckets": [
            {"name": "short", "max_tokens": 96, "max_trajectories_per_instance": cap},
            {"name": "long", "max_tokens": 256, "max_trajectories_per_instance": cap}]}})


@pytest.fixture
def store() -> MemorySchedulerStore:
    return MemorySchedulerStore()


async def add_job(store: MemorySchedulerStore, spec: JobSpec, published: bool = True) -> None:
    store.put_job(JOB, spec.to_json(), published=published)


async def add_instance(store: MemorySchedulerStore, instance: str, bucket: str,
                       role: t.WorkerRole = t.WorkerRole.CORE_ROLLOUT, epoch: int = 1) -> None:
    store.grant_lease(instance, role, bucket, epoch)


async def started(store: MemorySchedulerStore, spec: JobSpec) -> SchedulerCore:
    await add_job(store, spec)
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    return core


async def counters(store: MemorySchedulerStore) -> dict[str, int]:
    return await store.counters(JOB)


async def test_admission_stops_at_the_staleness_budget(store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=2, staleness=1))
    for _ in range(10):
        await core._tick(core._jobs[JOB])
    assert (await counters(store))["admitted_groups"] == (1 + 1) * 2


async def test_a_ticks_groups_are_admitted_together(store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=3, staleness=1))
    await core._tick(core._jobs[JOB])
    assert (await counters(store))["admitted_groups"] == 6
    assert (await counters(store))["admitted"] == 6 * 2
    assert len(store.inbox("rollout-0")) == 6 * 2


async def test_trainer_progress_reopens_the_budget(store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=2, staleness=0))
    await core._tick(core._jobs[JOB])
    assert (await counters(store))["admitted_groups"] == 2
    await store.incr_counters(JOB, trained_groups=2)
    await core._tick(core._jobs[JOB])
    assert (await counters(store))["admitted_groups"] == 4


async def test_nothing_is_admitted_before_weights_are_published(
        store: MemorySchedulerStore) -> None:
    spec = make_spec()
    await add_job(store, spec, published=False)
    await add_instance(store, "rollout-0", "short")
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    await core._tick(core._jobs[JOB])
    assert (await counters(store)).get("admitted_groups", 0) == 0


async def test_placement_spreads_least_loaded_and_writes_inboxes(
        store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    await add_instance(store, "rollout-1", "long")
    core = await started(store, make_spec(prompts=2, samples=2))
    await core._tick(core._jobs[JOB])
    load = store.load(JOB)
    assert sum(load.values()) == 4
    assert max(load.values()) - min(load.values()) <= 1
    assert len(store.inbox("rollout-0")) + len(store.inbox("rollout-1")) == 4
    assert len(await store.pending(JOB)) == 0


async def test_full_instances_keep_trajectories_pending_not_queued_on_one(
        store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=2, samples=2, cap=1))
    await core._tick(core._jobs[JOB])
    # One slot in 'short'; 'long' has no live instance: the rest waits in Redis.
    assert len(store.inbox("rollout-0")) == 1
    assert len(await store.pending(JOB)) >= 1


async def test_finish_releases_the_slot(store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=1, samples=2))
    await core._tick(core._jobs[JOB])
    traj_id = next(iter(await core._store.assignments(JOB)))
    await core.report_finished(JOB, traj_id, 10, t.TrajectoryStatus.FINISHED)
    assert store.load(JOB)["rollout-0"] == 1
    assert traj_id not in await core._store.assignments(JOB)


async def test_instance_without_lease_gets_its_trajectories_requeued(
        store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    await add_instance(store, "rollout-1", "long")
    core = await started(store, make_spec(prompts=2, samples=2))
    await core._tick(core._jobs[JOB])
    lost = [tid for tid, inst in (await core._store.assignments(JOB)).items()
            if inst == "rollout-1"]
    store.expire_lease("rollout-1")  # the lease expired
    await core._tick(core._jobs[JOB])
    assignments = await core._store.assignments(JOB)
    assert all(assignments[tid] == "rollout-0" for tid in lost)
    assert (await counters(store))["requeued"] == len(lost)
    assert store.inbox("rollout-1") == []
    task = await core._store.task(JOB, lost[0])
    assert task is not None and task.attempt == 1


async def test_tool_return_for_unknown_trajectory_stays(store: MemorySchedulerStore) -> None:
    core = await started(store, make_spec())
    state = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
    decision = await core.report_tool_return(JOB, "nope", state, 5)
    assert decision.action is t.DecisionAction.STAY
    assert decision.reason == "unknown_trajectory"


async def test_restarted_scheduler_resumes_running_jobs_and_pending_work(
        store: MemorySchedulerStore) -> None:
    core = await started(store, make_spec(prompts=1, samples=2))
    await core._tick(core._jobs[JOB])  # no instance: admitted work waits in Redis
    assert len(await store.pending(JOB)) == 2
    fresh = SchedulerCore(store, FakeClock())
    await fresh.drain(0)  # run() resumes jobs, then returns at once since stopping
    await fresh.run()
    assert JOB in fresh._jobs
    await add_instance(store, "rollout-0", "short")
    await fresh._tick(fresh._jobs[JOB])
    assert len(store.inbox("rollout-0")) == 2
    assert (await counters(store))["admitted_groups"] == 1


async def test_stats_report_policy_and_counters(store: MemorySchedulerStore) -> None:
    core = await started(store, make_spec(policy="cmlfq"))
    stats = await core.stats(JOB)
    assert stats["policy"] == "cmlfq"
    assert json.dumps(stats)


async def test_a_resumed_job_requeues_what_was_assigned_and_continues_admission(
        store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=2, samples=2, staleness=0))
    await core._tick(core._jobs[JOB])
    assigned = await core._store.assignments(JOB)
    assert len(assigned) == 4 and (await counters(store))["admitted_groups"] == 2
    # The job was cancelled: its instance acked and dropped those trajectories.
    await core.stop_job(JOB)
    resumed = SchedulerCore(store, FakeClock())
    await resumed.start_job(JOB, resume=True)
    assert await resumed._store.assignments(JOB) == {}
    assert store.load(JOB) == {}
    assert (await counters(store))["requeued"] == 4
    await resumed._tick(resumed._jobs[JOB])
    # Placed again (same trajectory ids, attempt 1); no new group: the budget is spent.
    assert sorted(await resumed._store.assignments(JOB)) == sorted(assigned)
    assert (await counters(store))["admitted_groups"] == 2
    await store.incr_counters(JOB, trained_groups=2)
    await resumed._tick(resumed._jobs[JOB])
    assert (await counters(store))["admitted_groups"] == 4  # admission continues


async def test_a_plain_start_keeps_assignments_of_live_instances(
        store: MemorySchedulerStore) -> None:
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=1, samples=2))
    await core._tick(core._jobs[JOB])
    restarted = SchedulerCore(store, FakeClock())
    await restarted.start_job(JOB)  # a scheduler restart, not a resume
    assert len(await restarted._store.assignments(JOB)) == 2
    assert (await counters(store)).get("requeued", 0) == 0
