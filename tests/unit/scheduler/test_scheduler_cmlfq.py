"""SchedulerCore with C-MLFQ on the in-memory store: policy state survives a restart,
trainer steps reach ``on_step_end``, moves are decided here and committed by the
handoff (tests/store/test_scheduler_core_on_redis.py, with the rollout's store),
decisions are observable."""

from __future__ import annotations

import dataclasses

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libra import types as t
from libra.clock import FakeClock
from libra.errors import InvalidArgument
from libra.jobspec import CmlfqSpec, JobSpec, job_spec_from_dict
from scheduling.policy.cmlfq import CmlfqConfig, CmlfqPolicy
from services.scheduler import metrics
from services.scheduler.core import SchedulerCore, build_policy_config
from services.scheduler.memory_store import MemorySchedulerStore

JOB = "job-1"
FAIL = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.FAILURE)


# The service mechanics (restart, handoff, step ends) are tested under the reference's
# rules: one visit is evidence and every new trajectory enters the shortest bucket.
REFERENCE_RULES = {"entry": "shortest", "disagree_rule": "stay", "live_thresholds": False,
                   "min_node_visits": 1, "max_queue_length": 0}


def cmlfq_spec(rebuild: int = 50) -> JobSpec:
    return job_spec_from_dict({
        "name": "t", "algorithm": {"prompts_per_step": 1, "samples_per_prompt": 4,
                                   "max_staleness": 0},
        "layout": {"policy": "cmlfq",
                   "cmlfq": {"rebuild_interval_steps": rebuild, **REFERENCE_RULES},
                   "buckets": [{"name": "short", "max_tokens": 96},
                               {"name": "long", "max_tokens": 256}]}})


@pytest.fixture
def store() -> MemorySchedulerStore:
    return MemorySchedulerStore()


async def started(store: MemorySchedulerStore, spec: JobSpec) -> SchedulerCore:
    store.put_job(JOB, spec.to_json())
    for instance, bucket in (("rollout-0", "short"), ("rollout-1", "long")):
        store.grant_lease(instance, t.WorkerRole.CORE_ROLLOUT, bucket, 0)
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    return core


async def restarted(store: MemorySchedulerStore) -> SchedulerCore:
    core = SchedulerCore(store, FakeClock())
    await core.start_job(JOB)
    return core


async def counters(store: MemorySchedulerStore) -> dict[str, int]:
    return await store.counters(JOB)


async def teach_one_group(core: SchedulerCore, total_tokens: int) -> list[str]:
    """Admit a group; every member returns from a tool at token 10 and finishes."""
    await core._tick(core._jobs[JOB])
    trajs = sorted(await core._store.assignments(JOB))
    for traj_id in trajs:
        await core.report_tool_return(JOB, traj_id, FAIL, 10)
        await core.report_finished(JOB, traj_id, total_tokens, t.TrajectoryStatus.FINISHED)
    await core._store.incr_counters(JOB, trained_groups=1)  # reopen the budget
    return trajs


def tree_of(core: SchedulerCore) -> dict:
    policy = core._jobs[JOB].policy
    assert isinstance(policy, CmlfqPolicy)
    return policy.tree.to_dict()


async def test_restarted_scheduler_keeps_the_tree_and_decides_the_same(
        store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec())
    await teach_one_group(core, 200)  # remaining 190 tokens after the tool return: long
    store.set_job_step(JOB, 1)
    await core._tick(core._jobs[JOB])  # step end (snapshot) + admit the next group
    fresh = await restarted(store)
    assert tree_of(fresh) == tree_of(core)
    first, second = sorted(await core._store.assignments(JOB))[:2]
    before = await core.report_tool_return(JOB, first, FAIL, 10)
    after = await fresh.report_tool_return(JOB, second, FAIL, 10)  # placed by `core`
    assert before == after
    assert (after.action, after.target_bucket, after.reason) == (
        t.DecisionAction.MOVE, "long", "move")


async def test_restart_between_step_ends_replays_finishes_from_the_ring(
        store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec())
    await teach_one_group(core, 200)  # no step end yet: no snapshot, only the ring
    await core._tick(core._jobs[JOB])  # policy state is written behind, once per tick
    fresh = await restarted(store)
    assert tree_of(fresh) == tree_of(core)
    assert tree_of(fresh)["num_insertions"] == 4


async def test_trainer_step_advance_calls_on_step_end(store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec(rebuild=1))
    await teach_one_group(core, 200)
    assert store.policy_state(JOB).get("tree") is None
    store.set_job_step(JOB, 2)  # two steps ended since the last tick
    await core._tick(core._jobs[JOB])
    assert core._jobs[JOB].last_step == 2
    assert core._jobs[JOB].policy.stats()["rebuilds"] == 2
    assert store.policy_state(JOB).get("tree") is not None


async def decided_move(store: MemorySchedulerStore,
                       ) -> tuple[SchedulerCore, str, dict[str, int]]:
    """A C-MLFQ MOVE to rollout-1 decided for a trajectory running on rollout-0; returns
    the core, the trajectory and the counters as they were before the decision."""
    return await decide_a_move(await started(store, cmlfq_spec()))


async def decide_a_move(core: SchedulerCore) -> tuple[SchedulerCore, str, dict[str, int]]:
    """``decided_move`` on a started core (any store), rollout-0 short, rollout-1 long."""
    await teach_one_group(core, 200)
    await core._tick(core._jobs[JOB])
    traj_id = sorted(await core._store.assignments(JOB))[0]
    before = await core._store.counters(JOB)
    decision = await core.report_tool_return(JOB, traj_id, FAIL, 10)
    assert (decision.action, decision.target_instance) == (t.DecisionAction.MOVE, "rollout-1")
    return core, traj_id, before


async def test_move_is_decided_in_memory_and_reserves_the_target_locally(
        store: MemorySchedulerStore) -> None:
    core, traj_id, before = await decided_move(store)
    # Nothing is written: the rollout instance commits the move when it hands off.
    assert (await core._store.assignments(JOB))[traj_id] == "rollout-0"
    assert store.load(JOB) == {"rollout-0": 4} and await counters(store) == before
    local = {i.instance_id: i.active_trajectories for i in core._jobs[JOB].instances}
    assert local == {"rollout-0": 3, "rollout-1": 1}


async def test_move_that_never_happens_leaves_assignment_and_load_consistent(
        store: MemorySchedulerStore) -> None:
    core, traj_id, before = await decided_move(store)
    # The trajectory finished on rollout-0 before the decision reached it.
    await core.report_finished(JOB, traj_id, 50, t.TrajectoryStatus.FINISHED)
    assert store.load(JOB) == {"rollout-0": 3}
    assert traj_id not in await core._store.assignments(JOB)
    assert await counters(store) == before
    await core._refresh_instances(core._jobs[JOB])  # the local reservation is re-read
    local = {i.instance_id: i.active_trajectories for i in core._jobs[JOB].instances}
    assert local == {"rollout-0": 3, "rollout-1": 0}


async def test_decision_is_counted_and_set_on_the_current_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    decision = t.PlacementDecision(t.DecisionAction.MOVE, "long", "rollout-1", "move")
    counter = metrics.DECISIONS_TOTAL.labels(reason="move", action="move")
    before = counter._value.get()
    with provider.get_tracer("test").start_as_current_span("ReportToolReturn"):
        metrics.record_decision("traj-1", decision)
    assert counter._value.get() == before + 1
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert (span.attributes[metrics.ATTR_ACTION], span.attributes[metrics.ATTR_REASON],
            span.attributes[metrics.ATTR_TARGET_BUCKET]) == ("move", "move", "long")


def test_cmlfq_spec_defaults_equal_the_policy_defaults() -> None:
    spec_defaults = dataclasses.asdict(CmlfqSpec())
    spec_defaults["bucket_thresholds_tokens"] = None  # [] means "use max_tokens"
    assert spec_defaults == {f.name: getattr(CmlfqConfig(), f.name)
                             for f in dataclasses.fields(CmlfqConfig)}


def test_layout_cmlfq_table_maps_onto_cmlfq_config() -> None:
    spec = job_spec_from_dict({"layout": {"policy": "cmlfq", "cmlfq": {
        "rebuild_interval_steps": 3, "bucket_thresholds_tokens": [50, 300],
        "enable_fallback": False, **REFERENCE_RULES}}})
    config = build_policy_config(spec)
    assert config == CmlfqConfig(rebuild_interval_steps=3, bucket_thresholds_tokens=(50, 300),
                                 enable_fallback=False, entry="shortest", disagree_rule="stay",
                                 live_thresholds=False, min_node_visits=1, max_queue_length=0)


@pytest.mark.parametrize(("key", "value"), [("entry", "longest"), ("disagree_rule", "p90"),
                                            ("max_queue_length", -1)])
def test_layout_cmlfq_rejects_unknown_rules_naming_the_field(key: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        job_spec_from_dict({"layout": {"policy": "cmlfq", "cmlfq": {key: value}}})
    assert err.value.field == f"layout.cmlfq.{key}"
    assert build_policy_config(job_spec_from_dict({})) is None  # least_loaded: defaults


async def test_an_instance_the_layout_cannot_reach_is_flagged_idle_while_work_waits(
        store: MemorySchedulerStore, caplog: pytest.LogCaptureFixture) -> None:
    spec = job_spec_from_dict({
        "name": "t", "algorithm": {"prompts_per_step": 1, "samples_per_prompt": 4,
                                   "max_staleness": 0},
        "layout": {"policy": "cmlfq", "buckets": [
            {"name": "short", "max_tokens": 96, "max_trajectories_per_instance": 1},
            {"name": "long", "max_tokens": 256, "max_trajectories_per_instance": 1}]}})
    # Registered under a bucket the spec lacks.
    store.grant_lease("rollout-typo", t.WorkerRole.CORE_ROLLOUT, "lng", 1)
    core = await started(store, spec)
    with caplog.at_level("WARNING", logger="services.scheduler.core"):
        await core._tick(core._jobs[JOB])  # 4 trajectories, room for 2
        await core._tick(core._jobs[JOB])  # the pending pass finds rollout-typo idle
    run = core._jobs[JOB]
    assert len(run.pending or {}) == 2 and run.idle_while_queued == ("rollout-typo",)
    assert "idle while 2 trajectories wait" in caplog.text and "rollout-typo" in caplog.text
