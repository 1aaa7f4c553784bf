"""InProcessTrainerClient (services/trainer/inprocess.py): the gRPC trainer client's
surface on a core in this process, over the in-memory store; errors as over gRPC."""
# ruff: noqa: F811 - the imported ``rig`` fixture is a parameter of every test

from __future__ import annotations

import asyncio
import inspect

import pytest

from libra import types as t
from libra.clients.runner import GrpcTrainerClient
from libra.errors import FailedPrecondition, Internal, NotFound
from services.trainer.inprocess import InProcessTrainerClient
from tests.unit.trainer.trainer_rig import (  # noqa: F401 - the rig fixture
    JOB,
    Rig,
    make_group,
    rig,
)
from tests.waiting import DEFAULT_TIMEOUT_S, wait_until


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(cls).items()
            if callable(member) and not name.startswith("_")}


def test_it_has_the_grpc_clients_methods_and_signatures() -> None:
    grpc_side = _public_methods(GrpcTrainerClient)
    grpc_side["close"] = inspect.signature(GrpcTrainerClient.close)  # from the base class
    assert _public_methods(InProcessTrainerClient) == grpc_side


async def test_a_job_runs_to_its_end_through_the_client(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, max_staleness=4)
    await rig.write(*make_group(0), *make_group(1))
    core = rig.new_core()
    client = InProcessTrainerClient(core)
    assert (await client.status()).phase == "idle"
    await client.start_job(JOB)
    await asyncio.wait_for(core.wait(), DEFAULT_TIMEOUT_S)
    status = await client.status()
    assert (status.job_id, status.phase, status.step) == (JOB, "done", 2)
    assert [rec["step"] for _, rec in rig.coordinator.steps] == [1, 2]
    assert rig.coordinator.done[-1][1] is t.JobState.SUCCEEDED
    await client.close()


async def test_errors_arrive_as_the_grpc_client_raises_them(rig: Rig) -> None:
    client = InProcessTrainerClient(rig.new_core())
    with pytest.raises(NotFound, match="not found"):
        await client.start_job("no-such-job")
    await client.start_job(JOB)  # nothing in the stream: it stays busy collecting
    with pytest.raises(FailedPrecondition, match="busy"):
        await client.start_job(JOB)
    await client.stop_job(JOB)
    assert (await client.status()).phase == "idle"


async def test_an_unexpected_core_error_is_internal(rig: Rig) -> None:
    core = rig.new_core()

    async def broken(job_id: str, resume: bool = False) -> None:
        raise KeyError(job_id)

    core.start_job = broken  # type: ignore[method-assign]
    with pytest.raises(Internal, match="KeyError") as err:
        await InProcessTrainerClient(core).start_job(JOB)
    assert isinstance(err.value.__cause__, KeyError)


async def test_a_stop_of_another_job_changes_nothing(rig: Rig) -> None:
    core = rig.new_core()
    client = InProcessTrainerClient(core)
    await client.start_job(JOB)
    await wait_until(lambda: core.phase == "training")
    await client.stop_job("other-job")
    assert (await client.status()).is_working_on(JOB)
    await client.stop_job(JOB)
