"""CoordinatorCore with the elastic pool: role changes and planning on ReportStep.

Fakes: ``FakeRunner`` replaces the trainer and scheduler clients, ``FakeRollout`` the
rollout instances (it moves its own lease like a real one), ``FakeClock`` wall time. The
store (``InMemoryCoordinatorStore``), job spec parser, executor and live planner are real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from libra import metrics
from libra import types as t
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, InvalidArgument, LeaseLost, NotFound
from libra.wire.step_record import step_record_from_dict
from scheduling.planner.live import live_planner
from services.coordinator import step_metrics
from services.coordinator.core import CoordinatorCore
from services.coordinator.elastic import ElasticWiring
from services.coordinator.memory_store import InMemoryCoordinatorStore
from tests.unit.coordinator.elastic_rig import FakeRollout
from tests.unit.coordinator.test_coordinator_core import FakeRunner

ELASTIC_SPEC = """
name = "elastic"
[algorithm]
num_steps = 50
[elastic]
enabled = true
warmup_steps = 0
"""
PLAIN_SPEC = 'name = "plain"\n[algorithm]\nnum_steps = 5\n'
# The keys the trainer reports (services/trainer/core.py); the trainer waits 1 s for
# data and trains 3 s: train-bound.
TRAIN_BOUND = {"train_s": 3.0, "rollout_s": 1.0, "reward_mean": 0.5, "num_trajectories": 8,
               "tokens_mean": 40.0, "turns_mean": 2.0, "hybrid_workers": 0,
               "hybrid_joining": 0}


class Rig:
    def __init__(self, *, wired: bool = True, run_root: Path = Path("/tmp/libra-test-runs"),
                 planner_factory: Any = live_planner) -> None:
        self.clock = FakeClock()
        self.store = InMemoryCoordinatorStore(self.clock)
        self.rollouts: dict[str, FakeRollout] = {}
        wiring = ElasticWiring(planner_factory=planner_factory,
                               rollouts=lambda address: self.rollouts[address],
                               trainer_address="trainer:1", rpc_deadline_s=0.05)
        self.core = CoordinatorCore(self.store, FakeRunner(), FakeRunner(), self.clock,
                                    run_root, elastic=wiring if wired else None)

    async def lease(self, worker_id: str, role: t.WorkerRole) -> t.Lease:
        self.rollouts[worker_id] = FakeRollout(worker_id, self.store)
        return await self.core.acquire_lease(worker_id, role, "short", worker_id, 60_000)

    async def step(self, job_id: str, step: int, **extra: float) -> None:
        await self.core.report_step(job_id, step_record_from_dict({"step": step, **TRAIN_BOUND,
                                                                    **extra}))
        loop = self.core.elastic_loop(job_id)
        if loop is not None:
            await loop.idle()


async def test_change_worker_role_moves_hybrid_rollout_to_joining() -> None:
    rig = Rig()
    lease = await rig.lease("h1", t.WorkerRole.HYBRID_ROLLOUT)
    joining = await rig.core.change_worker_role("h1", lease.epoch,
                                                t.WorkerRole.HYBRID_JOINING)
    assert joining.role is t.WorkerRole.HYBRID_JOINING and joining.epoch > lease.epoch


async def test_change_worker_role_refuses_core_workers_and_stale_epochs() -> None:
    rig = Rig()
    core_lease = await rig.lease("r0", t.WorkerRole.CORE_ROLLOUT)
    with pytest.raises(FailedPrecondition):
        await rig.core.change_worker_role("r0", core_lease.epoch,
                                          t.WorkerRole.HYBRID_JOINING)
    with pytest.raises(InvalidArgument) as err:
        await rig.core.change_worker_role("r0", core_lease.epoch, t.WorkerRole.SERVICE)
    assert err.value.field == "role"
    with pytest.raises(LeaseLost):
        await rig.core.change_worker_role("r0", core_lease.epoch + 99,
                                          t.WorkerRole.HYBRID_ROLLOUT)


async def test_report_step_of_elastic_job_plans_and_lends() -> None:
    rig = Rig()
    await rig.lease("r0", t.WorkerRole.CORE_ROLLOUT)
    await rig.lease("h1", t.WorkerRole.HYBRID_ROLLOUT)
    job = await rig.core.create_job(ELASTIC_SPEC, "toml")
    await rig.step(job.job_id, 1)
    kinds = [e["kind"] for e in await rig.core.job_events(job.job_id)]
    assert kinds == ["plan", "join_requested", "join_acked"]
    assert [w.role for w in await rig.core.list_workers()] == [
        t.WorkerRole.HYBRID_JOINING, t.WorkerRole.CORE_ROLLOUT]
    plan = (await rig.core.job_events(job.job_id))[0]
    assert (plan["step"], plan["inputs"]["train_s"], plan["inputs"]["rollout_s"]) == (1, 3.0, 1.0)
    # The trainer (no lease) is the core-training worker; r0 stays as the reserve.
    assert plan["inputs"]["pool"]["core_training"] == 1 and plan["inputs"]["capacity"] == 1
    assert (plan["elastic"]["action"], plan["elastic"]["desired_hybrids"],
            plan["elastic"]["reason"]) == ("join", 1, "borrow")
    # The same pass on /metrics: one decision counted, labelled with the elastic move.
    passes = _planner_passes(job.job_id)
    assert sum(passes.values()) == 1 and next(iter(passes))[1] == "join"


async def test_rollout_pressure_in_the_step_record_releases_active_workers() -> None:
    rig = Rig()
    await rig.lease("r0", t.WorkerRole.CORE_ROLLOUT)
    await rig.lease("h1", t.WorkerRole.HYBRID_ROLLOUT)
    await rig.lease("h2", t.WorkerRole.HYBRID_ROLLOUT)
    job = await rig.core.create_job(ELASTIC_SPEC, "toml")
    await rig.step(job.job_id, 1)
    for worker_id in ("h1", "h2"):
        await rig.rollouts[worker_id].activate()
    await rig.step(job.job_id, 2, hybrid_workers=2, queue_pressure=0.9)
    roles = {w.worker_id: w.role for w in await rig.core.list_workers()}
    assert roles == {"r0": t.WorkerRole.CORE_ROLLOUT, "h1": t.WorkerRole.HYBRID_ROLLOUT,
                     "h2": t.WorkerRole.HYBRID_ROLLOUT}
    events = await rig.core.job_events(job.job_id)
    plans = [e for e in events if e["kind"] == "plan"]
    assert [p["elastic"]["action"] for p in plans] == ["join", "release"]
    assert (plans[1]["trigger"], plans[1]["inputs"]["queue_pressure"]) == (
        "queue_pressure", 0.9)
    assert plans[1]["elastic"]["reason"] == "rollout_pressure"
    assert sorted(e["worker_id"] for e in events if e["kind"] == "released") == ["h1", "h2"]
    assert {e["reason"] for e in events if e["kind"] == "released"} == {"rollout_pressure"}


async def test_job_end_returns_lent_workers_to_rollout() -> None:
    rig = Rig()
    await rig.lease("r0", t.WorkerRole.CORE_ROLLOUT)
    await rig.lease("h1", t.WorkerRole.HYBRID_ROLLOUT)
    job = await rig.core.create_job(ELASTIC_SPEC, "toml")
    await rig.step(job.job_id, 1)
    await rig.core.cancel_job(job.job_id)
    loop = rig.core.elastic_loop(job.job_id)
    assert loop is not None
    await loop.idle()
    roles = {w.worker_id: w.role for w in await rig.core.list_workers()}
    assert roles["h1"] is t.WorkerRole.HYBRID_ROLLOUT
    assert (await rig.core.job_events(job.job_id))[-1]["reason"] == "job_ended"


async def test_report_step_of_plain_job_plans_nothing() -> None:
    rig = Rig()
    await rig.lease("h1", t.WorkerRole.HYBRID_ROLLOUT)
    await rig.lease("h2", t.WorkerRole.HYBRID_ROLLOUT)
    job = await rig.core.create_job(PLAIN_SPEC, "toml")
    await rig.step(job.job_id, 1)
    assert rig.core.elastic_loop(job.job_id) is None
    assert await rig.core.job_events(job.job_id) == []
    assert _planner_passes(job.job_id) == {}


async def test_elastic_job_without_wiring_still_records_steps() -> None:
    rig = Rig(wired=False)
    job = await rig.core.create_job(ELASTIC_SPEC, "toml")
    await rig.step(job.job_id, 1)
    _job, steps, _counters = await rig.core.get_job(job.job_id)
    assert [s["step"] for s in steps] == [1]


async def test_events_of_unknown_job_raise_not_found() -> None:
    with pytest.raises(NotFound):
        await Rig().core.job_events("nope")


async def test_a_resumed_job_plans_with_a_fresh_elastic_loop(tmp_path: Path) -> None:
    rig = Rig(run_root=tmp_path)
    job = await rig.core.create_job(ELASTIC_SPEC, "toml")
    await rig.step(job.job_id, 1)
    first = rig.core.elastic_loop(job.job_id)
    assert first is not None
    await rig.core.cancel_job(job.job_id)  # stops the loop: it releases everything
    checkpoint = Path(job.run_dir) / "checkpoints" / "step_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "meta.json").write_text('{"step": 1, "policy_version": 0, "files": {}}')
    await rig.core.resume_job(job.job_id)
    await rig.step(job.job_id, 2)
    second = rig.core.elastic_loop(job.job_id)
    assert second is not None and second is not first


async def test_the_job_planner_plans_with_the_jobs_max_staleness() -> None:
    """The live planner's pipeline depth comes from the job's ``algorithm.max_staleness``
    (the simulator reads the same knob), not the spec default."""
    built: list[Any] = []

    def factory(spec: Any, max_staleness: int) -> Any:
        built.append(live_planner(spec, max_staleness))
        return built[-1]

    rig = Rig(planner_factory=factory)
    await rig.lease("r0", t.WorkerRole.CORE_ROLLOUT)
    spec = ELASTIC_SPEC.replace("num_steps = 50", "num_steps = 50\nmax_staleness = 3")
    job = await rig.core.create_job(spec, "toml")
    await rig.step(job.job_id, 1)
    assert [planner.config.max_staleness for planner in built] == [3]


# -- the planner's decisions on /metrics ----------------------------------------------------

@pytest.mark.parametrize(("decision", "labels"), [
    ({"fired": True, "applied": True, "elastic": {"action": "join"}}, ("applied", "join")),
    ({"fired": True, "applied": False, "elastic": None}, ("held", "none")),
    ({"fired": False, "applied": False, "elastic": {"action": "hold"}}, ("not_fired", "hold")),
    ({"applied": False, "elastic": {"action": "made-up"}}, ("held", "none")),
])
def test_planner_decisions_map_to_bounded_labels(decision: dict, labels: tuple) -> None:
    assert step_metrics.planner_decision(decision) == labels
    assert labels[0] in metrics.PLANNER_DECISIONS and labels[1] in metrics.ELASTIC_ACTIONS


def _planner_passes(job_id: str) -> dict[tuple[str, str], float]:
    """(decision, elastic) -> count of ``job_id``'s planner passes in this process."""
    family = metrics.counter("libra_job_planner_decisions_total").collect()[0]
    return {(s.labels["decision"], s.labels["elastic"]): s.value for s in family.samples
            if s.name.endswith("_total") and s.labels["job"] == job_id}


def test_a_planner_pass_is_counted_with_its_predicted_gain() -> None:
    job = "job-planner-metrics"
    name = "libra_job_planner_decisions_total"
    labels = {"job": job, "decision": "held", "elastic": "release"}
    before = REGISTRY.get_sample_value(name, labels) or 0.0
    step_metrics.export_plan(job, {"fired": True, "applied": False, "net_gain_s": -0.25,
                                   "elastic": {"action": "release"}})
    assert REGISTRY.get_sample_value(name, labels) == before + 1
    assert REGISTRY.get_sample_value("libra_job_planner_predicted_gain_seconds",
                                     {"job": job}) == -0.25
    assert metrics.remove_job(job) == 2
    assert REGISTRY.get_sample_value(name, labels) is None
