"""InProcessRolloutClient: the RolloutApi surface over a core in the same loop (the
in-memory store), with the results and errors a gRPC caller gets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.clients.api import RolloutApi
from libra.errors import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument
from libra.limits import MAX_GENERATION_AHEAD_MS
from services.rollout.inprocess import InProcessRolloutClient
from tests.unit.rollout.lend_fakes import FakeHybridTrainer, Opener
from tests.unit.rollout.rig import HERE, JOB, Rig, make_task, started_rig
from tests.waiting import wait_until


@pytest.fixture
async def hybrid(tmp_path: Path) -> AsyncIterator[tuple[Rig, InProcessRolloutClient]]:
    async with started_rig(tmp_path, bucket="long", role=t.WorkerRole.HYBRID_ROLLOUT,
                           opener=Opener(), load_trainer=FakeHybridTrainer) as rig:
        yield rig, InProcessRolloutClient(rig.core)


def test_it_implements_the_rollout_api() -> None:
    api = {name for name in vars(RolloutApi) if not name.startswith("_")}
    assert api == {"lend", "reclaim", "get_instance_status"}
    assert all(callable(getattr(InProcessRolloutClient, name)) for name in api)


async def test_status_reports_the_instance_and_its_work(rig: Rig) -> None:
    client = InProcessRolloutClient(rig.core)
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    status = await client.get_instance_status()
    assert (status.instance_id, status.bucket, status.job_id, status.role,
            status.hybrid_phase, status.num_active_trajectories) == (
        HERE, "short", JOB, "core-rollout", "", 0)
    assert status.policy_version == 0 and status.num_tokens_generated > 0


async def test_lend_then_reclaim(hybrid) -> None:  # noqa: ANN001
    rig, client = hybrid
    lease = rig.core.lease
    lent = await client.lend(JOB, lease.epoch, 1, "trainer:1")
    assert lent.lease.role is t.WorkerRole.HYBRID_JOINING and lent.num_handed_back == 0
    assert lent.lease == rig.core.lease and lent.lease is not rig.core.lease  # a copy
    assert (await client.get_instance_status()).role == "hybrid-joining"
    back = await client.reclaim(2, "test")
    assert back.role is t.WorkerRole.HYBRID_ROLLOUT


async def test_a_stale_epoch_is_a_failed_precondition(hybrid) -> None:  # noqa: ANN001
    rig, client = hybrid
    with pytest.raises(FailedPrecondition, match="lease epoch"):
        await client.lend(JOB, rig.core.lease.epoch - 1, 1, "trainer:1")


async def test_a_forged_generation_is_an_invalid_argument_naming_the_field(
        hybrid) -> None:  # noqa: ANN001
    rig, client = hybrid
    forged = rig.clock.now_ms() + MAX_GENERATION_AHEAD_MS + 1
    with pytest.raises(InvalidArgument) as caught:
        await client.reclaim(forged, "test")
    assert caught.value.field == "generation"


async def test_a_call_past_its_timeout_is_deadline_exceeded(hybrid) -> None:  # noqa: ANN001
    # A tool call in flight holds the lend's hand-back (up to the tool deadline).
    rig, client = hybrid
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    with pytest.raises(DeadlineExceeded):
        await client.lend(JOB, rig.core.lease.epoch, 1, "trainer:1", timeout_s=0.05)
    rig.tools.gate.set()


async def test_an_unexpected_failure_is_internal(tmp_path: Path) -> None:
    # A hybrid instance built without its trainer loader: the lend cannot start a join.
    async with started_rig(tmp_path, role=t.WorkerRole.HYBRID_ROLLOUT,
                           opener=Opener()) as rig:
        with pytest.raises(Internal):
            await InProcessRolloutClient(rig.core).lend(JOB, rig.core.lease.epoch, 1, "t:1")
