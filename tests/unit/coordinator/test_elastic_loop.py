"""ElasticLoop: the planner's decisions on the trainer's step records, recorded as plan
events and spans, and handed to the executor without waiting for its lends.

The rig (elastic_rig.py): the real in-memory store, fake rollout clients, FakeClock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from libra import types as t
from libra.jobspec import ElasticSpec
from libra.wire.step_record import step_record_from_dict
from scheduling.planner.live import live_planner
from services.coordinator.elastic import ElasticExecutor, ElasticLoop
from tests.unit.coordinator.elastic_rig import (
    HYBRID,
    JOB,
    ROLLOUT,
    FakeRollout,
    LendReplyStub,
    make,
    release,
)


class GatedRollout(FakeRollout):
    """Lends only after the test opens the gate: shows on_step does not wait."""

    gate: asyncio.Event

    async def lend(self, *args: Any, **kwargs: Any) -> LendReplyStub:
        await self.gate.wait()
        return await super().lend(*args, **kwargs)


def trainer_record(step: int, train_s: float, rollout_s: float, **extra: Any) -> dict[str, Any]:
    """A step record with the keys the trainer reports (``services/trainer/core.py``)."""
    return {"step": step, "train_s": train_s, "rollout_s": rollout_s, "num_trajectories": 8,
            "tokens_mean": 40.0, "turns_mean": 2.0, "hybrid_workers": 0, "hybrid_joining": 0,
            **extra}


def leases(**roles: t.WorkerRole) -> list[t.Lease]:
    return [t.Lease(t.WorkerId(w), role, "s", w, 1, 0, 1) for w, role in roles.items()]


async def test_on_step_records_the_plan_and_returns_before_the_lend_finishes() -> None:
    # Plans from the first step: no warm-up, every step an interval, a cheap transition.
    rig = await make({"r0": ROLLOUT, "h1": HYBRID}, warmup_steps=0, plan_interval_steps=1,
                     transition_cost_s=0.5)
    gated = GatedRollout("h1", rig.store)
    gated.gate = asyncio.Event()
    rig.rollouts["h1"] = gated
    executor = ElasticExecutor(job_id=JOB, spec=rig.spec, rollouts=lambda a: rig.rollouts[a],
                               events=rig.store, clock=rig.clock, trainer_address="t:1",
                               rpc_deadline_s=30.0)
    loop = ElasticLoop(job_id=JOB, planner=live_planner(rig.spec), executor=executor,
                       events=rig.store, leases=rig.store.live_leases, clock=rig.clock)
    await loop.on_step(step_record_from_dict(trainer_record(1, train_s=3.0, rollout_s=1.0)))
    (plan,) = await rig.events("plan")
    # Fitted: w_train = 3 s x 1 trainer, w_rollout = 1 s x 2 rollout workers. Lending h1:
    # max(3 / 2, 2 / 1) = 2 s against max(3 / 1, 2 / 2) = 3 s, gain 1 s, net 0.5 s.
    assert (plan["fired"], plan["trigger"], plan["applied"]) == (True, "interval", True)
    assert plan["inputs"]["train_s"] == 3.0 and plan["inputs"]["rollout_s"] == 1.0
    assert (plan["inputs"]["w_train"], plan["inputs"]["w_rollout"]) == (3.0, 2.0)
    assert plan["candidate"] == {"train_workers": 2, "rollout_workers": 1}
    assert plan["raw_gain_s"] == pytest.approx(1.0)
    assert plan["net_gain_s"] == pytest.approx(0.5)
    assert (plan["elastic"]["action"], plan["elastic"]["desired_hybrids"],
            plan["elastic"]["reason"]) == ("join", 1, "approved_plan")
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"  # lend still waiting
    gated.gate.set()
    await loop.idle()
    assert (await rig.roles_now())["h1"] == "hybrid-joining"
    (requested,) = await rig.events("join_requested")
    assert requested["reason"] == "approved_plan"


def test_live_planner_joins_on_a_train_bound_sequence() -> None:
    # Warm-up 2 steps, planning every 5, transition 1 s; no dwell, to see every step's say.
    spec = ElasticSpec(enabled=True, min_dwell_steps=0)
    planner = live_planner(spec)
    workers = leases(r0=ROLLOUT, h1=HYBRID, h2=HYBRID, h3=HYBRID)
    for step in range(1, 5):
        decision, signal = planner.observe(trainer_record(step, 3.0, 1.0), workers, {})
        # No plan yet (warm-up, then no trigger); the train/rollout hysteresis borrows,
        # as many as the fitted model finds best: max(3 / 2, 4 / 3) = 1.5 s with one.
        assert decision["fired"] is False
        assert decision["reason"] == ("warmup" if step == 1 else "no_trigger")
        assert signal is not None and (signal.action, signal.desired) == ("join", 1)
        assert signal.reason == "borrow"
    decision, signal = planner.observe(trainer_record(5, 3.0, 1.0), workers, {})
    # Interval plan on the fitted model: w_train = 3, w_rollout = 1 s x 4 = 4; the best
    # split lends one: max(3 / 2, 4 / 3) = 1.5 s against 3 s now.
    assert (decision["fired"], decision["trigger"], decision["applied"]) == (
        True, "interval", True)
    assert decision["inputs"]["history_size"] == 40 and decision["inputs"]["capacity"] == 3
    assert decision["candidate"] == {"train_workers": 2, "rollout_workers": 3}
    assert decision["raw_gain_s"] == pytest.approx(1.5)
    assert decision["net_gain_s"] == pytest.approx(1.5 - spec.transition_cost_s)
    assert signal is not None and (signal.action, signal.desired, signal.current) == (
        "join", 1, 0)
    assert (signal.reason, signal.ttl_step) == ("approved_plan", 5 + spec.ttl_steps)


def test_live_planner_releases_under_rollout_pressure() -> None:
    spec = ElasticSpec(enabled=True, warmup_steps=0)
    workers = leases(h1=t.WorkerRole.HYBRID_TRAINING, r0=ROLLOUT)
    decision, signal = live_planner(spec).observe(
        trainer_record(4, 3.0, 1.0, hybrid_workers=1), workers, {"queue_pressure": 0.9})
    assert signal is not None and (signal.action, signal.desired, signal.current) == (
        "release", 0, 1)
    assert (signal.reason, signal.ttl_step) == ("rollout_pressure", 4 + spec.ttl_steps)
    assert (decision["trigger"], decision["inputs"]["queue_pressure"]) == (
        "queue_pressure", 0.9)
    assert decision["elastic"]["reason"] == "rollout_pressure"


async def test_plans_joins_and_releases_are_spans_when_traces_are_exported() -> None:
    import json

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libra import tracing
    from libra.trace_export import OtelSpanSink

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.set_sink(OtelSpanSink(provider))
    try:
        rig = await make({"r0": ROLLOUT, "h1": HYBRID}, warmup_steps=0,
                         plan_interval_steps=1, transition_cost_s=0.5)
        loop = ElasticLoop(job_id=JOB, planner=live_planner(rig.spec),
                           executor=rig.executor, events=rig.store,
                           leases=rig.store.live_leases, clock=rig.clock)
        await loop.on_step(step_record_from_dict(trainer_record(1, train_s=3.0,
                                                                rollout_s=1.0)))
        await loop.idle()
        rig.executor.set_signal(release())
        await rig.reconcile(step=2)
    finally:
        tracing.set_sink(None)
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert {"elastic.plan", "elastic.join_requested", "elastic.join_acked",
            "elastic.release_requested", "elastic.released"} <= set(spans)
    plan = spans["elastic.plan"].attributes
    assert plan["libra.job_id"] == JOB and plan["libra.applied"] is True
    assert plan["libra.net_gain_s"] == pytest.approx(0.5)
    assert json.loads(plan["libra.inputs"])["train_s"] == 3.0
    joined = spans["elastic.join_acked"].attributes
    assert (joined["libra.worker_id"], joined["libra.step"]) == ("h1", 1)
    assert spans["elastic.released"].attributes["libra.worker_id"] == "h1"
    assert spans["elastic.released"].start_time == rig.clock.now_ms() * 10**6
