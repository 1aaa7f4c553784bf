"""InProcessSchedulerClient on a core with the in-memory store: the gRPC client's
surface, decisions fenced by lease epoch, and the errors the gRPC client raises."""

from __future__ import annotations

import inspect
import json

import pytest

from libra import types as t
from libra.clients.scheduler import GrpcSchedulerClient, SchedulerClientApi
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, Internal, NotFound
from services.scheduler.core import SchedulerCore
from services.scheduler.inprocess import InProcessSchedulerClient
from services.scheduler.memory_store import MemorySchedulerStore
from tests.unit.scheduler.test_scheduler_core import JOB, make_spec

FAIL = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.FAILURE)
HERE = "rollout-0"


@pytest.fixture
def store() -> MemorySchedulerStore:
    store = MemorySchedulerStore()
    store.put_job(JOB, make_spec(policy="length_aware", prompts=1, samples=2).to_json())
    store.grant_lease(HERE, t.WorkerRole.CORE_ROLLOUT, "short", 3)
    store.grant_lease("rollout-1", t.WorkerRole.CORE_ROLLOUT, "long", 1)
    return store


@pytest.fixture
def core(store: MemorySchedulerStore) -> SchedulerCore:
    return SchedulerCore(store, FakeClock())


@pytest.fixture
def client(core: SchedulerCore) -> InProcessSchedulerClient:
    return InProcessSchedulerClient(core)


async def placed(client: InProcessSchedulerClient, core: SchedulerCore) -> list[str]:
    await client.start_job(JOB)
    await core._tick(core._jobs[JOB])
    return sorted(await core._store.assignments(JOB))


def test_the_surface_is_the_grpc_clients() -> None:
    public = {name for name, _ in inspect.getmembers(SchedulerClientApi, inspect.isfunction)
              if not name.startswith("_")}
    assert public == {"start_job", "stop_job", "report_tool_return", "report_finished",
                      "stats", "close"}
    for name in public:
        grpc_sig = inspect.signature(getattr(GrpcSchedulerClient, name))
        assert inspect.signature(getattr(InProcessSchedulerClient, name)) == grpc_sig, name


async def test_a_tool_return_is_decided_by_the_core(
        client: InProcessSchedulerClient, core: SchedulerCore) -> None:
    first, _ = await placed(client, core)
    decision = await client.report_tool_return(JOB, first, FAIL, 200, HERE, 3)
    # length_aware: 200 tokens outgrew `short`, the other instance holds `long`.
    assert (decision.action, decision.target_instance) == (t.DecisionAction.MOVE, "rollout-1")
    stay = await client.report_tool_return(JOB, "nope", FAIL, 5, HERE, 3,
                                           needs_answer=False)
    assert (stay.action, stay.reason) == (t.DecisionAction.STAY, "unknown_trajectory")
    stats = await client.stats(JOB)
    assert stats["decisions"] == {decision.reason: 1, "unknown": 1}
    assert stats == json.loads(json.dumps(stats))


async def test_a_stale_epoch_is_refused(client: InProcessSchedulerClient,
                                        core: SchedulerCore) -> None:
    first, _ = await placed(client, core)
    with pytest.raises(FailedPrecondition, match="stale lease epoch 2 of 'rollout-0'"):
        await client.report_tool_return(JOB, first, FAIL, 10, HERE, 2)
    with pytest.raises(FailedPrecondition, match="no live lease"):
        await client.report_finished(JOB, first, 10, t.TrajectoryStatus.FINISHED, "ghost", 1)


async def test_a_job_not_scheduled_fails_the_report(client: InProcessSchedulerClient) -> None:
    with pytest.raises(FailedPrecondition, match="not being scheduled"):
        await client.report_tool_return("other", "a", FAIL, 10, HERE, 3)
    with pytest.raises(FailedPrecondition, match="not being scheduled"):
        await client.stats(JOB)


async def test_an_unknown_job_is_not_found(client: InProcessSchedulerClient) -> None:
    with pytest.raises(NotFound, match="'missing'"):
        await client.start_job("missing")


async def test_a_finish_gives_the_slot_back_and_stop_ends_scheduling(
        client: InProcessSchedulerClient, core: SchedulerCore,
        store: MemorySchedulerStore) -> None:
    first, _ = await placed(client, core)
    await client.report_finished(JOB, first, 40, t.TrajectoryStatus.FINISHED, HERE, 3)
    assert first not in await store.assignments(JOB)
    await client.stop_job(JOB)
    await client.stop_job(JOB)  # idempotent, as over gRPC
    with pytest.raises(FailedPrecondition):
        await client.stats(JOB)
    await client.close()


async def test_an_unexpected_failure_reaches_the_caller_as_internal(
        client: InProcessSchedulerClient, store: MemorySchedulerStore) -> None:
    store.put_job(JOB, "{not json")  # a corrupt record: the core fails, not the caller
    with pytest.raises(Internal):
        await client.start_job(JOB)
