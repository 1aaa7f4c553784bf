"""SchedulerCore on the in-memory store: batched tool-return reports, finishes read from
the trajectory stream, fencing by lease epoch, placement only on rollout-role leases."""

from __future__ import annotations

import contextlib

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libra import types as t
from libra.clock import FakeClock
from libra.errors import FailedPrecondition
from libra.telemetry import spans_recorded
from services.scheduler import metrics, servicer
from services.scheduler.core import SchedulerCore, ToolReturnReport
from services.scheduler.memory_store import MemorySchedulerStore
from tests.unit.scheduler.test_scheduler_core import JOB, add_job, counters, make_spec

FAIL = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.FAILURE)


@pytest.fixture
def store() -> MemorySchedulerStore:
    return MemorySchedulerStore()


async def lease(store: MemorySchedulerStore, instance: str, bucket: str = "short",
                role: str = "core-rollout", epoch: int = 1) -> None:
    store.grant_lease(instance, t.WorkerRole(role), bucket, epoch)


async def started(store: MemorySchedulerStore, clock: FakeClock | None = None,
                  **spec_args: int | str) -> SchedulerCore:
    await add_job(store, make_spec(**spec_args))  # type: ignore[arg-type]
    core = SchedulerCore(store, clock or FakeClock())
    await core.start_job(JOB)
    return core


def reports(traj_ids: list[str], job_id: str = JOB) -> list[ToolReturnReport]:
    return [ToolReturnReport(job_id, traj_id, FAIL, 10) for traj_id in traj_ids]


# -- batched reports ----------------------------------------------------------------------

async def test_batch_decides_every_report_in_order(store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0")
    core = await started(store, prompts=1, samples=3)
    await core._tick(core._jobs[JOB])
    placed = sorted(await core._store.assignments(JOB))
    out = await core.report_tool_returns("rollout-0", 1, reports([*placed, "nope"]))
    assert all(isinstance(d, t.PlacementDecision) and d.action is t.DecisionAction.STAY
               and d.reason != "unknown_trajectory" for d in out[:3])
    assert isinstance(out[3], t.PlacementDecision) and out[3].reason == "unknown_trajectory"


async def test_an_item_of_a_job_not_scheduled_fails_alone(store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0")
    core = await started(store)
    ok, bad = await core.report_tool_returns(
        "rollout-0", 1, [*reports(["a"]), *reports(["b"], job_id="other")])
    assert isinstance(ok, t.PlacementDecision)
    assert isinstance(bad, FailedPrecondition)


# -- fencing ------------------------------------------------------------------------------

async def test_stale_epoch_is_refused_naming_it(store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0", epoch=5)
    core = await started(store)
    with pytest.raises(FailedPrecondition, match="stale lease epoch 4 of 'rollout-0'"):
        await core.report_tool_returns("rollout-0", 4, reports(["a"]))


async def test_epoch_newer_than_the_snapshot_is_checked_against_the_store(
        store: MemorySchedulerStore) -> None:
    clock = FakeClock()
    await lease(store, "rollout-0", epoch=1)
    core = await started(store, clock)
    await core._tick(core._jobs[JOB])  # snapshot: epoch 1
    await lease(store, "rollout-0", epoch=2)  # granted anew since
    clock.advance(1.0)
    (decision,) = await core.report_tool_returns("rollout-0", 2, reports(["a"]))
    assert isinstance(decision, t.PlacementDecision)
    with pytest.raises(FailedPrecondition, match="current epoch 2"):
        await core.report_tool_returns("rollout-0", 1, reports(["a"]))


# -- finishes from the trajectory stream ----------------------------------------------------

async def test_finish_in_the_stream_gives_the_slot_back(store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0")
    core = await started(store, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    first, second = sorted(await core._store.assignments(JOB))
    store.add_finish(JOB, first, 40)
    store.add_finish(JOB, second, 40)
    await core._tick(core._jobs[JOB])
    assert await core._store.assignments(JOB) == {}
    assert store.load(JOB)["rollout-0"] == 0


# -- placement targets only rollout roles -----------------------------------------------------

async def test_instances_lent_to_training_get_nothing_new(store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0", role="hybrid-rollout")
    await lease(store, "rollout-1", role="hybrid-joining")
    await lease(store, "rollout-2", role="hybrid-training")
    await lease(store, "trainer-0", role="core-training")
    core = await started(store, prompts=2, samples=2)
    await core._tick(core._jobs[JOB])
    assert set((await core._store.assignments(JOB)).values()) == {"rollout-0"}
    for lent in ("rollout-1", "rollout-2", "trainer-0"):
        assert len(store.inbox(lent)) == 0


async def test_work_of_an_instance_lent_to_training_is_requeued_elsewhere(
        store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0", role="hybrid-rollout")
    core = await started(store, prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    await lease(store, "rollout-1", role="hybrid-rollout")
    await lease(store, "rollout-0", role="hybrid-joining", epoch=2)  # lent to training
    await core._tick(core._jobs[JOB])
    assert set((await core._store.assignments(JOB)).values()) == {"rollout-1"}
    assert (await counters(store))["requeued"] == 2
    assert len(store.inbox("rollout-0")) == 0


# -- round trips and observability --------------------------------------------------------

async def test_moves_of_one_batch_are_decided_without_a_write(store: MemorySchedulerStore) -> None:
    await lease(store, "rollout-0", "short")
    await lease(store, "rollout-1", "long")
    core = await started(store, policy="length_aware", prompts=1, samples=2)
    await core._tick(core._jobs[JOB])
    trajs = sorted(await core._store.assignments(JOB))
    before = await counters(store)
    out = await core.report_tool_returns(
        "rollout-0", 1, [ToolReturnReport(JOB, tid, FAIL, 200) for tid in trajs])
    moved = [d for d in out if isinstance(d, t.PlacementDecision)
             and d.action is t.DecisionAction.MOVE]
    assert len(moved) == 2  # both outgrew `short`
    # The instances commit the moves when they hand off: Redis is untouched.
    assert await counters(store) == before
    assert set((await core._store.assignments(JOB)).values()) == {"rollout-0"}
    assert store.load(JOB) == {"rollout-0": len(trajs)}
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


async def test_batch_span_is_made_only_where_spans_are_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # No provider installed (as in a service that exports nothing): no span at all. The
    # global is cleared for this test: another test in this worker may have installed one.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert not spans_recorded()
    assert isinstance(servicer._batch_span(), contextlib.nullcontext)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # Installed as init_tracing would (the global is set-once: patched for this test).
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr(servicer, "_TRACER", provider.get_tracer("test"))
    assert spans_recorded()
    stay = t.PlacementDecision(t.DecisionAction.STAY, "", "", "stay")
    with servicer._batch_span():
        metrics.record_decisions([("a", stay)])
    (span,) = exporter.get_finished_spans()
    assert span.name == "scheduler.ToolReturns.batch"
    assert [dict(e.attributes or {})[metrics.ATTR_TRAJECTORY] for e in span.events] == ["a"]


async def test_leases_are_reread_once_per_snapshot_period(store: MemorySchedulerStore) -> None:
    clock = FakeClock()
    await lease(store, "rollout-0")
    await add_job(store, make_spec(prompts=1, samples=2))
    core = SchedulerCore(store, clock, lease_snapshot_s=1.0)
    await core.start_job(JOB)
    await core._tick(core._jobs[JOB])
    store.expire_lease("rollout-0")  # the lease expired
    await core._tick(core._jobs[JOB])
    assert (await counters(store)).get("requeued", 0) == 0  # not noticed within the period
    clock.advance(1.0)
    await core._tick(core._jobs[JOB])
    assert (await counters(store))["requeued"] == 2
