"""The in-process coordinator client (``services/coordinator/inprocess.py``): the gRPC
client's surface over a core in this process, with the errors the gRPC client raises.

Real: the core, ``InMemoryCoordinatorStore``, the job spec parser, the ``step_json``
codec. Fakes: ``FakeRunner`` for the trainer and the scheduler (the client never calls
them itself), a store whose ``list_jobs`` breaks (an unexpected failure, made certain).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from libra import types as t
from libra.clients.coordinator import CoordinatorApi, CoordinatorJobApi, GrpcCoordinatorClient
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, Internal, InvalidArgument, LeaseLost, NotFound
from services.coordinator.core import CoordinatorCore
from services.coordinator.inprocess import InProcessCoordinatorClient
from services.coordinator.memory_store import InMemoryCoordinatorStore
from tests.fakes.runner import FakeRunner

SPEC = 'name = "unit"\n[algorithm]\nnum_steps = 3\n'


def make_client(store: InMemoryCoordinatorStore | None = None,
                ) -> tuple[InProcessCoordinatorClient, InMemoryCoordinatorStore]:
    clock = FakeClock()
    store = store or InMemoryCoordinatorStore(clock)
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), clock,
                           Path("/tmp/libra-test-runs"))
    return InProcessCoordinatorClient(core), store


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in inspect.getmembers(cls)
            if not name.startswith("_") and inspect.iscoroutinefunction(fn)}


def test_it_has_every_method_of_the_grpc_client_with_the_same_parameters() -> None:
    grpc_side, local = _public(GrpcCoordinatorClient), _public(InProcessCoordinatorClient)
    assert set(grpc_side) <= set(local)
    for name, signature in grpc_side.items():
        shape = [(p.name, p.kind, p.default) for p in signature.parameters.values()]
        assert [(p.name, p.kind, p.default)
                for p in local[name].parameters.values()] == shape, name
    for protocol in (CoordinatorApi, CoordinatorJobApi):
        assert set(_public(protocol)) <= set(local), protocol.__name__


async def test_a_job_runs_reports_steps_and_ends_through_the_client() -> None:
    client, _ = make_client()
    job = await client.create_job(SPEC, "")  # an empty format is TOML, as on the wire
    assert job.state is t.JobState.RUNNING
    await client.report_step(job.job_id, {"step": 1, "policy_version": 1, "loss": 0.5})
    await client.report_step(job.job_id, t.StepRecord(step=2, policy_version=2))
    got, steps, counters = await client.get_job(job.job_id)
    assert (got.step, got.policy_version) == (2, 2)
    assert steps == [{"step": 1, "policy_version": 1, "loss": 0.5},
                     {"step": 2, "policy_version": 2}]
    assert counters == {}  # the in-memory store measures no backlog
    assert [j.job_id for j in await client.list_jobs()] == [job.job_id]
    cancelled = await client.cancel_job(job.job_id, "enough")
    assert (cancelled.state, cancelled.message) == (t.JobState.CANCELLED, "enough")
    with pytest.raises(FailedPrecondition, match="its steps are final"):
        await client.report_step(job.job_id, {"step": 3})
    assert await client.get_job_events(job.job_id) == []


async def test_a_repeated_step_report_is_stored_once() -> None:
    client, store = make_client()
    job = await client.create_job(SPEC)
    for _ in range(2):
        await client.report_step(job.job_id, {"step": 1, "reward_mean": 0.5}, "k:1")
    assert await store.steps(job.job_id) == [{"step": 1, "reward_mean": 0.5}]


async def test_answers_are_copies_as_over_the_wire() -> None:
    client, store = make_client()
    job = await client.create_job(SPEC)
    job.state = t.JobState.FAILED
    got, _, _ = await client.get_job(job.job_id)
    got.message = "changed by the caller"
    assert (await store.get_job(job.job_id)).state is t.JobState.RUNNING
    assert (await store.get_job(job.job_id)).message == ""


@pytest.mark.parametrize(("record", "field"), [
    ({"policy_version": 1}, "step_json.step"),
    ({"step": "3"}, "step_json.step"),
    ({"step": 1, "note": "text"}, "step_json.note"),
    (t.StepRecord(step=-1), "step_json.step"),
])
async def test_a_malformed_step_record_is_refused_naming_the_field(
        record: dict | t.StepRecord, field: str) -> None:
    client, store = make_client()
    job = await client.create_job(SPEC)
    with pytest.raises(InvalidArgument) as info:
        await client.report_step(job.job_id, record)
    assert info.value.field == field
    assert await store.steps(job.job_id) == []


async def test_domain_errors_reach_the_caller_as_they_are() -> None:
    client, _ = make_client()
    with pytest.raises(InvalidArgument) as info:
        await client.create_job('name = "unit"\n[algorithm]\nnum_steps = 0\n')
    assert info.value.field == "algorithm.num_steps"
    with pytest.raises(NotFound):
        await client.get_job("job-missing")
    with pytest.raises(InvalidArgument) as info:
        await client.acquire_lease("w1", t.WorkerRole.CORE_ROLLOUT, "", "h:1", ttl_ms=1)
    assert info.value.field == "ttl_ms"


async def test_leases_and_role_changes_are_fenced_through_the_client() -> None:
    client, _ = make_client()
    lease = await client.acquire_lease("w1", t.WorkerRole.HYBRID_ROLLOUT, "b", "h:1", 60_000)
    assert (await client.renew_lease("w1", lease.epoch)).epoch == lease.epoch
    joining = await client.change_worker_role("w1", lease.epoch, t.WorkerRole.HYBRID_JOINING)
    assert joining.epoch > lease.epoch
    with pytest.raises(LeaseLost):
        await client.renew_lease("w1", lease.epoch)  # the old fence
    with pytest.raises(FailedPrecondition):  # joining cannot go back to joining
        await client.change_worker_role("w1", joining.epoch, t.WorkerRole.HYBRID_JOINING)
    assert [w.role for w in await client.list_workers()] == [t.WorkerRole.HYBRID_JOINING]
    await client.release_lease("w1", joining.epoch)
    assert await client.list_workers() == []


class BrokenListStore(InMemoryCoordinatorStore):
    async def list_jobs(self) -> list[t.Job]:
        raise RuntimeError("disk on fire")


async def test_an_unexpected_failure_is_internal_as_the_grpc_client_sees_it() -> None:
    client, _ = make_client(BrokenListStore(FakeClock()))
    with pytest.raises(Internal, match="RuntimeError: disk on fire"):
        await client.list_jobs()
