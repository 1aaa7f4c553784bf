"""A hybrid-rollout instance lent to training and given back: RolloutCore.lend/reclaim over
a real Redis store, with a scripted gradient stream and a fake hybrid trainer (the torch
side is tested in tests/service/trainer/test_gradient_channel.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.errors import FailedPrecondition, InvalidArgument
from libra.limits import MAX_GENERATION_AHEAD_MS
from libra.training import channel as ch
from tests.fakes.engine import BlockUntilAbort
from tests.unit.rollout.lend_fakes import FakeHybridTrainer, Opener, ScriptedStream
from tests.unit.rollout.rig import HERE, JOB, Rig, make_task, started_rig
from tests.waiting import wait_until


@pytest.fixture
async def lent_rig(tmp_path: Path) -> AsyncIterator[tuple[Rig, Opener]]:
    opener = Opener()
    async with started_rig(tmp_path, bucket="long",
                           role=t.WorkerRole.HYBRID_ROLLOUT, opener=opener,
                           load_trainer=FakeHybridTrainer) as rig:
        yield rig, opener


async def test_lend_hands_back_a_trajectory_mid_turn_with_its_tokens(lent_rig) -> None:  # noqa: ANN001
    rig, opener = lent_rig
    rig.engine.queue(BlockUntilAbort("<calc>1+2</calc>", keep=2))
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: _generating(rig))
    lease = rig.core.lease
    assert lease is not None
    new_lease, handed = await rig.core.lend(JOB, lease.epoch, 1, "trainer:1")
    assert handed == 1
    await wait_until(lambda: _opened(opener))
    assert new_lease.role is t.WorkerRole.HYBRID_JOINING and new_lease.epoch > lease.epoch
    # The latest state is where the scheduler re-queues from; the inbox entry is done.
    saved = await rig.world.task(JOB, "tr-0")
    assert saved.num_generated_tokens == 2 and saved.check_aligned() is None
    assert saved.partial_turn_tokens == 2  # resumed as the same turn where it lands
    assert await rig.inbox_pending() == 0 and rig.core.num_active == 0
    (stream,) = opener.streams
    assert stream.sent[0] == ch.Hello(JOB, HERE, new_lease.epoch, 1)
    assert opener.addresses == ["trainer:1"]


async def _opened(opener: Opener) -> bool:
    return bool(opener.streams)


async def _generating(rig: Rig) -> bool:
    # A generate call, not any call: the engine's first call may be loading weights, and
    # a lend before generation started would hand back a trajectory with no tokens.
    return any(kind == "generate" for kind, _ in rig.engine.calls)


async def test_lend_is_refused_for_stale_epochs_and_old_generations(
        lent_rig) -> None:  # noqa: ANN001
    rig, _ = lent_rig
    lease = rig.core.lease
    assert lease is not None
    with pytest.raises(FailedPrecondition, match="lease epoch"):
        await rig.core.lend(JOB, lease.epoch - 1, 1, "trainer:1")
    await rig.core.lend(JOB, lease.epoch, 5, "trainer:1")
    with pytest.raises(FailedPrecondition, match="generation"):
        await rig.core.lend(JOB, rig.core.lease.epoch, 4, "trainer:1")


async def test_lend_is_refused_for_core_instances(tmp_path: Path) -> None:
    async with started_rig(tmp_path, role=t.WorkerRole.CORE_ROLLOUT,
                           opener=Opener(), load_trainer=FakeHybridTrainer) as rig:
        assert rig.core.lease is not None
        with pytest.raises(FailedPrecondition, match="only hybrid-rollout"):
            await rig.core.lend(JOB, rig.core.lease.epoch, 9, "trainer:1")


async def test_join_protocol_then_reclaim_returns_to_rollout(lent_rig) -> None:  # noqa: ANN001
    rig, opener = lent_rig
    rig.start()
    lease = rig.core.lease
    assert lease is not None
    await rig.core.lend(JOB, lease.epoch, 1, "trainer:1")
    await wait_until(lambda: _opened(opener))
    (stream,) = opener.streams
    stream.incoming.put_nowait(ch.Snapshot("/snap", 4, 2, "{}"))
    stream.incoming.put_nowait(ch.Update(5, b"merged", False, 1e-3))
    stream.incoming.put_nowait(ch.Offer(5))
    await wait_until(lambda: _sent(stream, ch.Activated))
    assert rig.core.lease.role is t.WorkerRole.HYBRID_TRAINING
    activated = next(m for m in stream.sent if isinstance(m, ch.Activated))
    assert activated == ch.Activated(rig.core.lease.epoch, 5)
    assert [m for m in stream.sent if isinstance(m, ch.Applied)] == [
        ch.Applied(4), ch.Applied(5, "sum-1")]
    sample_task = ch.SliceTask(6, 2, activated.epoch, 1, 0.5, [])
    stream.incoming.put_nowait(sample_task)
    await wait_until(lambda: _sent(stream, ch.GradientPayload))
    payload = next(m for m in stream.sent if isinstance(m, ch.GradientPayload))
    assert (payload.step, payload.epoch, payload.slice_id, payload.data) == (
        6, activated.epoch, 1, b"grad")
    assert rig.core.hybrid_phase == "active"

    back = await rig.core.reclaim(2, "test")
    assert back.role is t.WorkerRole.HYBRID_ROLLOUT and stream.closed
    # Serving rollouts again.
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    assert [tr.trajectory_id for tr in await rig.run_until_published()] == ["tr-1"]


async def _sent(stream: ScriptedStream, kind: type) -> bool:
    return any(isinstance(m, kind) for m in stream.sent)


async def test_a_lost_update_fails_the_join_and_the_worker_goes_back(lent_rig) -> None:  # noqa: ANN001
    rig, opener = lent_rig
    rig.start()
    await rig.core.lend(JOB, rig.core.lease.epoch, 1, "trainer:1")
    await wait_until(lambda: _opened(opener))
    (stream,) = opener.streams
    stream.incoming.put_nowait(ch.Snapshot("/snap", 4, 2, "{}"))
    stream.incoming.put_nowait(ch.Update(6, b"merged", False, 1e-3))  # step 5 missing
    await wait_until(lambda: _role_is(rig, t.WorkerRole.HYBRID_ROLLOUT))
    assert stream.closed and rig.core.hybrid_phase == ""


async def _role_is(rig: Rig, role: t.WorkerRole) -> bool:
    return rig.core.lease is not None and rig.core.lease.role is role


async def test_inbox_leftovers_are_dropped_on_reclaim(lent_rig) -> None:  # noqa: ANN001
    rig, _ = lent_rig
    await rig.core.lend(JOB, rig.core.lease.epoch, 1, "trainer:1")
    await rig.place(make_task(7))  # placed before the scheduler saw the role change
    await rig.core.reclaim(2, "test")
    assert await rig.inbox_size() == 0


async def test_generations_far_ahead_of_the_clock_or_negative_are_invalid(
        lent_rig) -> None:  # noqa: ANN001
    # A forged Reclaim(generation=2**63-1) used to raise the floor for ever, refusing every
    # later (wall-clock ms) lend. Now it is refused and changes nothing.
    rig, _ = lent_rig
    now_ms = rig.clock.now_ms()
    for forged in (2**63 - 1, now_ms + MAX_GENERATION_AHEAD_MS + 1, -1):
        with pytest.raises(InvalidArgument) as info:
            await rig.core.reclaim(forged, "forged")
        assert info.value.field == "generation"
        with pytest.raises(InvalidArgument):
            await rig.core.lend(JOB, rig.core.lease.epoch, forged, "trainer:1")
    lease, _ = await rig.core.lend(JOB, rig.core.lease.epoch, now_ms, "trainer:1")
    assert lease.role is t.WorkerRole.HYBRID_JOINING
    back = await rig.core.reclaim(now_ms + MAX_GENERATION_AHEAD_MS, "at the bound")
    assert back.role is t.WorkerRole.HYBRID_ROLLOUT
    with pytest.raises(FailedPrecondition, match="older"):  # monotonic per instance
        await rig.core.reclaim(now_ms, "older")
