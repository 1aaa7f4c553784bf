"""The core's gradient domain (pure): slices, join states, the acceptance rule, deadlines."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from libra.clock import SystemClock
from libra.training import channel as ch
from libra.training.samples import TrainSample
from libra.types import GroupId, TrajectoryId
from services.trainer.elastic import GradientDomain, split_slices
from tests.fakes.events import EventRecorder


def sample(group: int, index: int, trained_tokens: int) -> TrainSample:
    n = trained_tokens + 1
    return TrainSample(token_ids=[1] * n, loss_mask=[0] + [1] * trained_tokens,
                       rollout_logprobs=[0.0] * n, advantage=0.5,
                       group_id=GroupId(f"g{group}"),
                       trajectory_id=TrajectoryId(f"t{group}-{index}"))


def snapshot_at(step: int) -> ch.Snapshot:
    return ch.Snapshot(f"/tmp/snap-{step}", step, 3, "{}")


async def snapshot_fn(step: int) -> ch.Snapshot:
    return snapshot_at(step)


def drain(queue: asyncio.Queue) -> list[Any]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def active_session(domain: GradientDomain, worker: str = "r1", epoch: int = 5,
                         at_step: int = 10):
    session = domain.connect(ch.Hello("job", worker, epoch, 1))
    await domain.at_boundary(at_step, snapshot_fn)  # snapshot
    domain.on_message(session, ch.Applied(at_step))
    await domain.at_boundary(at_step, snapshot_fn)  # offer
    domain.on_message(session, ch.Activated(epoch + 1, at_step))
    await domain.at_boundary(at_step, snapshot_fn)  # active
    drain(session.outbox)
    return session


def test_split_keeps_groups_whole_and_balances_tokens() -> None:
    samples = [sample(g, i, tokens) for g, tokens in ((0, 8), (1, 4), (2, 4), (3, 1))
               for i in range(2)]
    slices = split_slices(samples, 2)
    assert len(slices) == 2
    groups = [{s.group_id for s in sl} for sl in slices]
    assert groups[0].isdisjoint(groups[1])
    loads = sorted(sum(sum(s.loss_mask) for s in sl) for sl in slices)
    assert loads == [16, 18]


def test_split_gives_fewer_slices_than_asked_when_groups_run_out() -> None:
    assert len(split_slices([sample(0, 0, 3), sample(0, 1, 3)], 3)) == 1


async def test_join_states_advance_at_boundaries_only() -> None:
    events = EventRecorder()
    domain = GradientDomain(SystemClock(), events)
    session = domain.connect(ch.Hello("job", "r1", 5, 1))
    assert session.state == "connected"
    await domain.at_boundary(10, snapshot_fn)
    assert session.state == "snapshot"
    assert drain(session.outbox) == [snapshot_at(10)]
    # Not caught up yet: no offer.
    await domain.at_boundary(11, snapshot_fn)
    assert session.state == "snapshot"
    domain.on_message(session, ch.Applied(11))
    await domain.at_boundary(11, snapshot_fn)
    assert session.state == "offered"
    assert drain(session.outbox) == [ch.Offer(11)]
    domain.on_message(session, ch.Activated(6, 11))
    # Activated but one step behind at this boundary: waits for the update.
    await domain.at_boundary(12, snapshot_fn)
    assert session.state == "offered"
    domain.on_message(session, ch.Applied(12))
    await domain.at_boundary(12, snapshot_fn)
    assert session.state == "active" and session.active_epoch == 6
    assert "hybrid_activated" in events.kinds()


@pytest.mark.parametrize(("payload", "reason"), [
    (ch.GradientPayload(11, 3, 5, 1, b""), "epoch 5 != 6"),
    (ch.GradientPayload(10, 3, 6, 1, b""), "step 10 != 11"),
    (ch.GradientPayload(11, 2, 6, 1, b""), "policy version 2 != 3"),
])
async def test_stale_payloads_are_refused(payload: ch.GradientPayload, reason: str) -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = await active_session(domain)
    assert domain.accept(session, payload, 11, 3) == reason
    assert domain.accept(session, ch.GradientPayload(11, 3, 6, 1, b""), 11, 3) is None


async def test_payload_of_a_joining_worker_does_not_count() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = domain.connect(ch.Hello("job", "r1", 5, 1))
    reason = domain.accept(session, ch.GradientPayload(1, 0, 5, 1, b""), 1, 0)
    assert reason == "worker is connected, not active"


async def test_gather_refuses_a_stale_payload_and_detaches_its_sender() -> None:
    events = EventRecorder()
    domain = GradientDomain(SystemClock(), events)
    session = await active_session(domain)
    domain.on_message(session, ch.GradientPayload(11, 3, 5, 1, b"x"))  # old epoch
    accepted, missing = await domain.gather({1: session}, 11, 3, deadline_s=1.0)
    assert accepted == {} and missing == {1: "epoch 5 != 6"}
    assert session.detached and domain.rejected_payloads == 1
    assert "payload_rejected" in events.kinds() and "hybrid_detached" in events.kinds()


async def test_gather_gives_up_at_the_deadline() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = await active_session(domain)
    accepted, missing = await domain.gather({1: session}, 11, 3, deadline_s=0.05)
    assert accepted == {} and missing == {1: "deadline passed"}
    assert session.detached


async def test_gather_returns_at_once_when_the_hybrid_disconnects() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = await active_session(domain)
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, domain.disconnect, session, "stream closed")
    accepted, missing = await domain.gather({1: session}, 11, 3, deadline_s=30.0)
    assert missing == {1: "hybrid detached"}


async def test_a_matching_payload_is_accepted() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = await active_session(domain)
    payload = ch.GradientPayload(11, 3, 6, 1, b"grad", {"loss": 1.0})
    asyncio.get_running_loop().call_later(0.01, domain.on_message, session, payload)
    accepted, missing = await domain.gather({1: session}, 11, 3, deadline_s=5.0)
    assert accepted == {1: payload} and missing == {}
    assert session.steps_contributed == 1 and not session.detached


async def test_lockstep_mismatch_detaches() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = await active_session(domain)
    domain.remember_checksum(11, "aaa")
    domain.on_message(session, ch.Applied(11, "aaa"))
    assert domain.lockstep_verified == 1 and not session.detached
    domain.remember_checksum(12, "bbb")
    domain.on_message(session, ch.Applied(12, "ccc"))
    assert session.detached


async def test_a_newer_epoch_replaces_the_old_session_and_an_older_one_is_refused() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    old = domain.connect(ch.Hello("job", "r1", 5, 1))
    with pytest.raises(ValueError, match="already connected"):
        domain.connect(ch.Hello("job", "r1", 4, 1))
    new = domain.connect(ch.Hello("job", "r1", 7, 2))
    assert old.detached and not new.detached
    assert isinstance(drain(old.outbox)[-1], ch.Detach)


async def test_activation_with_an_epoch_not_newer_than_the_join_detaches() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = domain.connect(ch.Hello("job", "r1", 5, 1))
    domain.on_message(session, ch.Activated(5, 0))
    assert session.detached


async def test_updates_go_to_joining_and_active_hybrids_past_their_snapshot() -> None:
    domain = GradientDomain(SystemClock(), EventRecorder())
    session = await active_session(domain, at_step=10)
    fresh = domain.connect(ch.Hello("job", "r2", 8, 1))  # no snapshot yet
    update = ch.Update(11, b"g", False, 1e-3)
    domain.broadcast(update)
    assert drain(session.outbox) == [update]
    assert drain(fresh.outbox) == []
