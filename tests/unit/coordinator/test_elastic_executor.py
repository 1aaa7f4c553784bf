"""ElasticExecutor and ElasticLoop: turning planner signals into lends and reclaims.

Fakes: ``FakeRollout`` replaces the rollout instances' gRPC clients (it performs the role
changes a real instance would, through the real ``InMemoryCoordinatorStore``, and can be
told to fail or never answer); ``FakeClock`` replaces wall time. Leases, role moves and
events go through the real in-memory store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.errors import DeadlineExceeded, Unavailable
from libra.jobspec import ElasticSpec
from libra.wire.step_record import step_record_from_dict
from scheduling.planner.live import live_planner
from services.coordinator.core import ROLE_MOVES
from services.coordinator.elastic import (
    ElasticExecutor,
    ElasticLoop,
    Signal,
)
from services.coordinator.memory_store import InMemoryCoordinatorStore

JOB = "job-e"
ROLLOUT, HYBRID = t.WorkerRole.CORE_ROLLOUT, t.WorkerRole.HYBRID_ROLLOUT


@dataclass
class LendReplyStub:
    lease: t.Lease
    num_handed_back: int = 2


@dataclass
class FakeRollout:
    """One rollout instance: lend moves its lease to hybrid-joining, reclaim back."""

    worker_id: str
    store: InMemoryCoordinatorStore
    lend_error: Exception | None = None
    lend_hangs: bool = False
    calls: list[tuple[str, int]] = field(default_factory=list)

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendReplyStub:
        self.calls.append(("lend", generation))
        if self.lend_hangs:
            await asyncio.Event().wait()
        if self.lend_error is not None:
            raise self.lend_error
        lease = await self.store.change_role(self.worker_id, expected_epoch,
                                             t.WorkerRole.HYBRID_JOINING,
                                             ROLE_MOVES[t.WorkerRole.HYBRID_JOINING])
        return LendReplyStub(lease)

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease:
        self.calls.append(("reclaim", generation))
        lease = await self.lease()
        if lease.role is HYBRID:
            return lease
        return await self.store.change_role(self.worker_id, lease.epoch, HYBRID)

    async def activate(self) -> None:
        lease = await self.lease()
        await self.store.change_role(self.worker_id, lease.epoch,
                                     t.WorkerRole.HYBRID_TRAINING)

    async def lease(self) -> t.Lease:
        return next(x for x in await self.store.live_leases() if x.worker_id == self.worker_id)


class Rig:
    """A store with leased workers, their fake rollouts and an executor over them."""

    def __init__(self, roles: dict[str, t.WorkerRole], **spec: Any) -> None:
        self.clock = FakeClock()
        self.store = InMemoryCoordinatorStore(self.clock)
        self.roles = roles
        self.rollouts = {w: FakeRollout(w, self.store) for w in roles}
        self.spec = ElasticSpec(enabled=True, **spec)
        self.executor = ElasticExecutor(
            job_id=JOB, spec=self.spec, rollouts=lambda address: self.rollouts[address],
            events=self.store, clock=self.clock, trainer_address="trainer:1",
            rpc_deadline_s=0.05)

    async def start(self) -> Rig:
        for worker_id, role in self.roles.items():
            await self.store.acquire_lease(t.Lease(t.WorkerId(worker_id), role, "short",
                                                   worker_id, 0, 0, 600_000))
        return self

    async def reconcile(self, step: int) -> None:
        await self.executor.reconcile(step, await self.store.live_leases())

    async def roles_now(self) -> dict[str, str]:
        return {x.worker_id: x.role.value for x in await self.store.live_leases()}

    async def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events = await self.store.events(JOB)
        return [e for e in events if kind is None or e["kind"] == kind]


def join(desired: int, ttl_step: int = 100) -> Signal:
    return Signal("join", desired, 0, "train-bound", ttl_step)


def release(desired: int = 0, ttl_step: int = 100) -> Signal:
    return Signal("release", desired, 0, "rollout-bound", ttl_step)


async def make(roles: dict[str, t.WorkerRole], **spec: Any) -> Rig:
    return await Rig(roles, **spec).start()


async def test_join_lends_hybrid_rollout_workers_with_the_epoch_it_saw() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    before = {x.worker_id: x.epoch for x in await rig.store.live_leases()}
    rig.executor.set_signal(join(2))
    await rig.reconcile(step=3)
    assert await rig.roles_now() == {"r0": "core-rollout", "h1": "hybrid-joining",
                                     "h2": "hybrid-joining"}
    requested = await rig.events("join_requested")
    assert {(e["worker_id"], e["epoch"], e["step"]) for e in requested} == {
        ("h1", before["h1"], 3), ("h2", before["h2"], 3)}
    assert all(e["ts_ms"] == rig.clock.now_ms() for e in requested)


async def test_each_lend_bumps_the_worker_generation() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    first = rig.executor.generation("h1")
    rig.executor.set_signal(release())
    await rig.reconcile(step=2)
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=3)
    lends = [g for kind, g in rig.rollouts["h1"].calls if kind == "lend"]
    assert lends[0] == first and lends[1] > first and rig.executor.generation("h1") == lends[1]


async def test_join_keeps_the_rollout_reserve() -> None:
    rig = await make({"h1": HYBRID, "h2": HYBRID, "h3": HYBRID}, reserve_workers=2)
    rig.executor.set_signal(join(3))
    await rig.reconcile(step=1)
    assert sorted((await rig.roles_now()).values()) == [
        "hybrid-joining", "hybrid-rollout", "hybrid-rollout"]
    (limited,) = await rig.events("join_limited")
    assert (limited["wanted"], limited["granted"]) == (3, 1)
    assert "reserve_workers=2" in limited["reason"]


async def test_plan_that_would_leave_rollout_with_no_worker_is_refused() -> None:
    rig = await make({"h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    assert await rig.roles_now() == {"h1": "hybrid-rollout"}
    (refused,) = await rig.events("join_refused")
    assert refused["reason"] == ("lending 1 worker(s) would leave 0 rollout-capable "
                                 "worker(s) (have 1, reserve_workers=1)")
    assert rig.rollouts["h1"].calls == []


async def test_release_cancels_joining_workers_before_active_ones() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    active = next(w for w, r in (await rig.roles_now()).items() if r == "hybrid-joining")
    await rig.rollouts[active].activate()
    rig.executor.set_signal(join(2))
    await rig.reconcile(step=2)  # the other one is now joining
    rig.executor.set_signal(release(desired=1))
    await rig.reconcile(step=3)
    roles = await rig.roles_now()
    assert roles[active] == "hybrid-training"
    assert sorted(roles.values()) == ["core-rollout", "hybrid-rollout", "hybrid-training"]
    (requested,) = await rig.events("release_requested")
    assert requested["role"] == "hybrid-joining" and requested["worker_id"] != active


async def test_release_to_zero_detaches_active_workers_at_a_new_generation() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    await rig.rollouts["h1"].activate()
    lent_generation = rig.executor.generation("h1")
    rig.executor.set_signal(release())
    await rig.reconcile(step=2)
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"
    assert rig.rollouts["h1"].calls[-1][0] == "reclaim"
    assert rig.rollouts["h1"].calls[-1][1] > lent_generation
    assert [e["kind"] for e in await rig.events()][-3:] == ["activated", "release_requested",
                                                             "released"]


async def test_activation_is_recorded_once() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    await rig.rollouts["h1"].activate()
    await rig.reconcile(step=2)
    await rig.reconcile(step=3)
    (activated,) = await rig.events("activated")
    assert activated["epoch"] == (await rig.rollouts["h1"].lease()).epoch


async def test_join_still_joining_after_timeout_is_reclaimed() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID}, join_timeout_s=60)
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    rig.clock.advance(59)
    await rig.reconcile(step=2)
    assert (await rig.roles_now())["h1"] == "hybrid-joining"
    rig.clock.advance(1)
    await rig.reconcile(step=3)
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"
    (failed,) = await rig.events("join_failed")
    assert (failed["worker_id"], failed["reason"], failed["waited_s"]) == ("h1", "timeout", 60)


@pytest.mark.parametrize("error", [Unavailable("connection refused"),
                                   DeadlineExceeded("deadline exceeded")])
async def test_lend_not_acknowledged_fails_the_join_and_rolls_back(error: Exception) -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.rollouts["h1"].lend_error = error
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    (failed,) = await rig.events("join_failed")
    assert failed["reason"].startswith("no_ack: ") and failed["worker_id"] == "h1"
    assert [kind for kind, _ in rig.rollouts["h1"].calls] == ["lend", "reclaim"]


async def test_lend_that_never_answers_is_abandoned_within_the_deadline() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.rollouts["h1"].lend_hangs = True
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)  # returns: the executor stops waiting at its deadline
    (failed,) = await rig.events("join_failed")
    assert failed["reason"].startswith("no_ack: TimeoutError")


async def test_worker_whose_join_failed_sits_out_the_plan_interval() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID}, plan_interval_steps=5)
    rig.rollouts["h1"].lend_error = Unavailable("down")
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    await rig.reconcile(step=2)
    assert [kind for kind, _ in rig.rollouts["h1"].calls] == ["lend", "reclaim"]
    await rig.reconcile(step=6)  # tried again (and fails again: lend, reclaim)
    assert [kind for kind, _ in rig.rollouts["h1"].calls] == ["lend", "reclaim"] * 2


async def test_expired_signal_releases_everything() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    rig.executor.set_signal(join(2, ttl_step=10))
    await rig.reconcile(step=5)
    await rig.reconcile(step=9)
    assert list((await rig.roles_now()).values()).count("hybrid-joining") == 2
    await rig.reconcile(step=10)
    assert list((await rig.roles_now()).values()).count("hybrid-rollout") == 2
    (expired,) = await rig.events("signal_expired")
    assert expired["ttl_step"] == 10
    assert {e["reason"] for e in await rig.events("released")} == {"signal_expired"}


async def test_hold_keeps_what_is_lent() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    rig.executor.set_signal(Signal("hold", 2, 1, "hysteresis", 100))
    await rig.reconcile(step=2)
    assert list((await rig.roles_now()).values()).count("hybrid-joining") == 1


async def test_stop_releases_everything() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    rig.executor.stop()
    await rig.reconcile(step=1)
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"
    assert (await rig.events("released"))[0]["reason"] == "job_ended"


# -- the loop around it ---------------------------------------------------------------


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
