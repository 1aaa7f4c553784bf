"""SchedulerCore with C-MLFQ against a real Redis: policy state survives a restart,
trainer steps reach ``on_step_end``, moves are decided here and committed by the
handoff, decisions are observable."""

from __future__ import annotations

import dataclasses

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.errors import InvalidArgument
from libra.jobspec import CmlfqSpec, JobSpec, job_spec_from_dict
from services.scheduler import metrics
from services.scheduler.core import SchedulerCore, build_policy_config
from services.scheduler.policy.cmlfq import CmlfqConfig, CmlfqPolicy
from services.scheduler.store import RedisSchedulerStore

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
def r(redis_bytes: aioredis.Redis) -> aioredis.Redis:
    return redis_bytes


async def started(r: aioredis.Redis, spec: JobSpec) -> SchedulerCore:
    await r.hset(keys.job(JOB), mapping={"spec_json": spec.to_json(), "state": "running",
                                         "step": 0})
    await r.zadd(keys.JOBS_INDEX, {JOB: 1})
    await r.hset(keys.policy(JOB), mapping={"version": 0})
    for instance, bucket in (("rollout-0", "short"), ("rollout-1", "long")):
        await r.sadd(keys.WORKERS, instance)
        await r.hset(keys.lease(instance), mapping={"role": "core-rollout", "bucket": bucket})
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await core.start_job(JOB)
    return core


async def restarted(r: aioredis.Redis) -> SchedulerCore:
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await core.start_job(JOB)
    return core


async def counters(r: aioredis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(keys.counters(JOB))).items()}


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
        r: aioredis.Redis) -> None:
    core = await started(r, cmlfq_spec())
    await teach_one_group(core, 200)  # remaining 190 tokens after the tool return: long
    await r.hset(keys.job(JOB), "step", 1)
    await core._tick(core._jobs[JOB])  # step end (snapshot) + admit the next group
    fresh = await restarted(r)
    assert tree_of(fresh) == tree_of(core)
    first, second = sorted(await core._store.assignments(JOB))[:2]
    before = await core.report_tool_return(JOB, first, FAIL, 10)
    after = await fresh.report_tool_return(JOB, second, FAIL, 10)  # placed by `core`
    assert before == after
    assert (after.action, after.target_bucket, after.reason) == (
        t.DecisionAction.MOVE, "long", "move")


async def test_restart_between_step_ends_replays_finishes_from_the_ring(
        r: aioredis.Redis) -> None:
    core = await started(r, cmlfq_spec())
    await teach_one_group(core, 200)  # no step end yet: no snapshot, only the ring
    await core._tick(core._jobs[JOB])  # policy state is written behind, once per tick
    fresh = await restarted(r)
    assert tree_of(fresh) == tree_of(core)
    assert tree_of(fresh)["num_insertions"] == 4


async def test_trainer_step_advance_calls_on_step_end(r: aioredis.Redis) -> None:
    core = await started(r, cmlfq_spec(rebuild=1))
    await teach_one_group(core, 200)
    assert not await r.exists(keys.sched_tree(JOB))
    await r.hset(keys.job(JOB), "step", 2)  # two steps ended since the last tick
    await core._tick(core._jobs[JOB])
    assert core._jobs[JOB].last_step == 2
    assert core._jobs[JOB].policy.stats()["rebuilds"] == 2
    assert await r.exists(keys.sched_tree(JOB))


async def load(r: aioredis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(keys.load(JOB))).items()}


async def decided_move(r: aioredis.Redis) -> tuple[SchedulerCore, str, dict[str, int]]:
    """A C-MLFQ MOVE to rollout-1 decided for a trajectory running on rollout-0; returns
    the core, the trajectory and the counters as they were before the decision."""
    core = await started(r, cmlfq_spec())
    await teach_one_group(core, 200)
    await core._tick(core._jobs[JOB])
    traj_id = sorted(await core._store.assignments(JOB))[0]
    before = await counters(r)
    decision = await core.report_tool_return(JOB, traj_id, FAIL, 10)
    assert (decision.action, decision.target_instance) == (t.DecisionAction.MOVE, "rollout-1")
    return core, traj_id, before


async def test_move_is_decided_in_memory_and_reserves_the_target_locally(
        r: aioredis.Redis) -> None:
    core, traj_id, before = await decided_move(r)
    # Nothing is written: the rollout instance commits the move when it hands off.
    assert (await core._store.assignments(JOB))[traj_id] == "rollout-0"
    assert await load(r) == {"rollout-0": 4} and await counters(r) == before
    local = {i.instance_id: i.active_trajectories for i in core._jobs[JOB].instances}
    assert local == {"rollout-0": 3, "rollout-1": 1}


async def test_handoff_commits_the_decided_move(r: aioredis.Redis) -> None:
    from services.rollout.store import RedisRolloutStore

    core, traj_id, before = await decided_move(r)
    await r.hset(keys.lease("rollout-0"), "epoch", 1)
    traj = await core._store.task(JOB, traj_id)
    assert traj is not None
    assert await RedisRolloutStore(r).handoff(traj, "rollout-0", "0-1", "rollout-1", "long", 1)
    assert (await core._store.assignments(JOB))[traj_id] == "rollout-1"
    assert await load(r) == {"rollout-0": 3, "rollout-1": 1}
    after = await counters(r)
    assert {k: after[k] - before.get(k, 0) for k in after} == {
        **{k: 0 for k in after}, "migrations": 1, "placed:long": 1}


async def test_move_that_never_happens_leaves_assignment_and_load_consistent(
        r: aioredis.Redis) -> None:
    core, traj_id, before = await decided_move(r)
    # The trajectory finished on rollout-0 before the decision reached it.
    await core.report_finished(JOB, traj_id, 50, t.TrajectoryStatus.FINISHED)
    assert await load(r) == {"rollout-0": 3}
    assert traj_id not in await core._store.assignments(JOB)
    assert await counters(r) == before
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
        r: aioredis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    spec = job_spec_from_dict({
        "name": "t", "algorithm": {"prompts_per_step": 1, "samples_per_prompt": 4,
                                   "max_staleness": 0},
        "layout": {"policy": "cmlfq", "buckets": [
            {"name": "short", "max_tokens": 96, "max_trajectories_per_instance": 1},
            {"name": "long", "max_tokens": 256, "max_trajectories_per_instance": 1}]}})
    await r.sadd(keys.WORKERS, "rollout-typo")  # registered under a bucket the spec lacks
    await r.hset(keys.lease("rollout-typo"), mapping={"role": "core-rollout", "bucket": "lng"})
    core = await started(r, spec)
    with caplog.at_level("WARNING", logger="services.scheduler.core"):
        await core._tick(core._jobs[JOB])  # 4 trajectories, room for 2
        await core._tick(core._jobs[JOB])  # the pending pass finds rollout-typo idle
    run = core._jobs[JOB]
    assert len(run.pending or {}) == 2 and run.idle_while_queued == ("rollout-typo",)
    assert "idle while 2 trajectories wait" in caplog.text and "rollout-typo" in caplog.text
