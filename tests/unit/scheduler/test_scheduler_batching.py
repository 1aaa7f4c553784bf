"""SchedulerCore against a real Redis: batched tool-return reports, finishes read from
the trajectory stream, fencing by lease epoch, placement only on rollout-role leases."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.errors import FailedPrecondition
from libra.wire.common import encode_trajectory
from services.scheduler import metrics
from services.scheduler.core import SchedulerCore, ToolReturnReport
from services.scheduler.store import RedisSchedulerStore
from tests.unit.scheduler.test_scheduler_core import JOB, add_job, counters, make_spec

FAIL = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.FAILURE)


@pytest.fixture
def r(redis_bytes: aioredis.Redis) -> aioredis.Redis:
    return redis_bytes


async def lease(r: aioredis.Redis, instance: str, bucket: str = "short",
                role: str = "core-rollout", epoch: int = 1) -> None:
    await r.sadd(keys.WORKERS, instance)
    await r.hset(keys.lease(instance), mapping={"role": role, "bucket": bucket,
                                                "epoch": epoch})


async def started(r: aioredis.Redis, clock: FakeClock | None = None,
                  **spec_args: int | str) -> SchedulerCore:
    await add_job(r, make_spec(**spec_args))  # type: ignore[arg-type]
    core = SchedulerCore(RedisSchedulerStore(r), clock or FakeClock())
    await core.start_job(JOB)
    return core


async def load(r: aioredis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(keys.load(JOB))).items()}


async def publish_finish(r: aioredis.Redis, traj_id: str, total_tokens: int = 40,
                         with_fields: bool = True) -> None:
    """What the rollout's publish appends to the job's trajectory stream."""
    traj = t.Trajectory(t.TrajectoryId(traj_id), t.JobId(JOB), t.GroupId("g"),
                        t.PromptId("p"), "Q", "1", status=t.TrajectoryStatus.FINISHED)
    entry: dict[str, str | bytes] = {"trajectory_id": traj_id, "data": encode_trajectory(traj)}
    if with_fields:
        entry |= {"total_tokens": str(total_tokens), "status": "finished"}
    await r.xadd(keys.trajectories(JOB), entry)


def reports(traj_ids: list[str], job_id: str = JOB) -> list[ToolReturnReport]:
    return [ToolReturnReport(job_id, traj_id, FAIL, 10) for traj_id in traj_ids]


# -- batched reports ----------------------------------------------------------------------

async def test_batch_decides_every_report_in_order(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=3)
    await core._tick(core._jobs[JOB])
    placed = sorted(await core._store.assignments(JOB))
    out = await core.report_tool_returns("rollout-0", 1, reports([*placed, "nope"]))
    assert all(isinstance(d, t.PlacementDecision) and d.action is t.DecisionAction.STAY
               and d.reason != "unknown_trajectory" for d in out[:3])
    assert isinstance(out[3], t.PlacementDecision) and out[3].reason == "unknown_trajectory"


async def test_an_item_of_a_job_not_scheduled_fails_alone(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r)
    ok, bad = await core.report_tool_returns(
        "rollout-0", 1, [*reports(["a"]), *reports(["b"], job_id="other")])
    assert isinstance(ok, t.PlacementDecision)
    assert isinstance(bad, FailedPrecondition)


# -- fencing ------------------------------------------------------------------------------

async def test_stale_epoch_is_refused_naming_it(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0", epoch=5)
    core = await started(r)
    with pytest.raises(FailedPrecondition, match="stale lease epoch 4 of 'rollout-0'"):
        await core.report_tool_returns("rollout-0", 4, reports(["a"]))


async def test_epoch_newer_than_the_snapshot_is_checked_against_redis(
        r: aioredis.Redis) -> None:
    clock = FakeClock()
    await lease(r, "rollout-0", epoch=1)
    core = await started(r, clock)
    await core._tick(core._jobs[JOB])  # snapshot: epoch 1
    await lease(r, "rollout-0", epoch=2)  # granted anew since
    clock.advance(1.0)
    (decision,) = await core.report_tool_returns("rollout-0", 2, reports(["a"]))
    assert isinstance(decision, t.PlacementDecision)
    with pytest.raises(FailedPrecondition, match="current epoch 2"):
        await core.report_tool_returns("rollout-0", 1, reports(["a"]))


# -- finishes from the trajectory stream ----------------------------------------------------

async def test_finish_in_the_stream_gives_the_slot_back_and_is_acked(
        r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first, second = sorted(await core._store.assignments(JOB))
    await publish_finish(r, first)
    await publish_finish(r, second, with_fields=False)  # an older rollout: decoded whole
    await core._tick(core._jobs[JOB])
    assert await core._store.assignments(JOB) == {}
    assert (await load(r))["rollout-0"] == 0
    pending = await r.xpending(keys.trajectories(JOB), keys.SCHEDULER_GROUP)
    assert pending["pending"] == 0


async def test_finish_read_twice_releases_once(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first = sorted(await core._store.assignments(JOB))[0]
    await publish_finish(r, first)
    await core._tick(core._jobs[JOB])
    # A restarted scheduler re-reads from the start of its group's pending list.
    fresh = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await fresh.start_job(JOB)
    await r.xgroup_setid(keys.trajectories(JOB), keys.SCHEDULER_GROUP, "0")
    await fresh._tick(fresh._jobs[JOB])
    assert (await load(r))["rollout-0"] == 1


async def test_finish_delivered_but_not_acked_is_read_again_after_a_restart(
        r: aioredis.Redis) -> None:
    await lease(r, "rollout-0")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first = sorted(await core._store.assignments(JOB))[0]
    await publish_finish(r, first)
    # The previous process read it (delivered) and died before releasing it.
    await r.xreadgroup(keys.SCHEDULER_GROUP, keys.SCHEDULER_GROUP,
                       {keys.trajectories(JOB): ">"})
    fresh = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    await fresh.start_job(JOB)
    await fresh._tick(fresh._jobs[JOB])
    assert first not in await fresh._store.assignments(JOB)
    assert (await load(r))["rollout-0"] == 1


# -- placement targets only rollout roles -----------------------------------------------------

async def test_instances_lent_to_training_get_nothing_new(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0", role="hybrid-rollout")
    await lease(r, "rollout-1", role="hybrid-joining")
    await lease(r, "rollout-2", role="hybrid-training")
    await lease(r, "trainer-0", role="core-training")
    core = await started(r, prompts=2, samples=2)
    await core._tick(core._jobs[JOB])
    assert set((await core._store.assignments(JOB)).values()) == {"rollout-0"}
    for lent in ("rollout-1", "rollout-2", "trainer-0"):
        assert await r.xlen(keys.inbox(lent)) == 0


async def test_work_of_an_instance_lent_to_training_is_requeued_elsewhere(
        r: aioredis.Redis) -> None:
    await lease(r, "rollout-0", role="hybrid-rollout")
    core = await started(r, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    await lease(r, "rollout-1", role="hybrid-rollout")
    await lease(r, "rollout-0", role="hybrid-joining", epoch=2)  # lent to training
    await core._tick(core._jobs[JOB])
    assert set((await core._store.assignments(JOB)).values()) == {"rollout-1"}
    assert (await counters(r))["requeued"] == 2
    assert await r.xlen(keys.inbox("rollout-0")) == 0


# -- round trips and observability --------------------------------------------------------

async def test_moves_of_one_batch_are_decided_without_a_write(r: aioredis.Redis) -> None:
    await lease(r, "rollout-0", "short")
    await lease(r, "rollout-1", "long")
    core = await started(r, policy="length_aware", prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    trajs = sorted(await core._store.assignments(JOB))
    before = await counters(r)
    out = await core.report_tool_returns(
        "rollout-0", 1, [ToolReturnReport(JOB, tid, FAIL, 200) for tid in trajs])
    moved = [d for d in out if isinstance(d, t.PlacementDecision)
             and d.action is t.DecisionAction.MOVE]
    assert len(moved) == 2  # both outgrew `short`
    # The instances commit the moves when they hand off: Redis is untouched.
    assert await counters(r) == before
    assert set((await core._store.assignments(JOB)).values()) == {"rollout-0"}
    assert await load(r) == {"rollout-0": len(trajs)}
    local = {i.instance_id: i.active_trajectories for i in core._jobs[JOB].instances}
    assert local == {"rollout-0": 0, "rollout-1": len(trajs)}


async def test_batch_decisions_are_counted_and_become_span_events() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    move = t.PlacementDecision(t.DecisionAction.MOVE, "long", "rollout-1", "move")
    stay = t.PlacementDecision(t.DecisionAction.STAY, "", "", "stay")
    counter = metrics.DECISIONS_TOTAL.labels(reason="move", action="move")
    before = counter._value.get()
    with provider.get_tracer("test").start_as_current_span("scheduler.ToolReturns.batch"):
        metrics.record_decisions([("a", move), ("b", stay)])
    assert counter._value.get() == before + 1
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes[metrics.ATTR_COUNT] == 2
    events = [dict(e.attributes or {}) for e in span.events]
    assert [(e[metrics.ATTR_TRAJECTORY], e[metrics.ATTR_ACTION]) for e in events] == [
        ("a", "move"), ("b", "stay")]


async def test_leases_are_reread_once_per_snapshot_period(r: aioredis.Redis) -> None:
    clock = FakeClock()
    await lease(r, "rollout-0")
    await add_job(r, make_spec(prompts=1, samples=2))
    core = SchedulerCore(RedisSchedulerStore(r), clock, lease_snapshot_s=1.0)
    await core.start_job(JOB)
    await core._tick(core._jobs[JOB])
    await r.delete(keys.lease("rollout-0"))  # the lease expired
    await core._tick(core._jobs[JOB])
    assert (await counters(r)).get("requeued", 0) == 0  # not noticed within the period
    clock.advance(1.0)
    await core._tick(core._jobs[JOB])
    assert (await counters(r))["requeued"] == 2
