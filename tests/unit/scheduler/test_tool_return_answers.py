"""Which batches of the ToolReturns stream the scheduler answers: a batch of stays goes
unanswered (up to the sender's ``max_unanswered`` in a row), a move, an error or
``answer_stays`` is answered at once, and the last batch is answered when the sender
ends its side. The servicer runs with a real core on the in-memory store, without a transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from libra.proto.scheduler.v1 import scheduler_pb2 as pb
from libra.wire.common import tool_state_to_proto
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore
from services.scheduler.servicer import SchedulerServicer
from tests.unit.scheduler.test_scheduler_cmlfq import (
    FAIL,
    JOB,
    cmlfq_spec,
    started,
    teach_one_group,
)

HERE = "rollout-0"


@pytest.fixture
def store() -> MemorySchedulerStore:
    return MemorySchedulerStore()


def batch(batch_id: int, *traj_ids: str, job_id: str = JOB, epoch: int = 0,
          answer_stays: bool = False, max_unanswered: int = 8) -> pb.ReportToolReturnsRequest:
    reports = [pb.ToolReturnReport(job_id=job_id, trajectory_id=traj_id,
                                   state=tool_state_to_proto(FAIL), tokens_so_far=10)
               for traj_id in traj_ids]
    return pb.ReportToolReturnsRequest(instance_id=HERE, lease_epoch=epoch, reports=reports,
                                       batch_id=batch_id, answer_stays=answer_stays,
                                       max_unanswered=max_unanswered)


async def answers(core: SchedulerCore, requests: list[pb.ReportToolReturnsRequest],
                  ) -> list[pb.ReportToolReturnsResponse]:
    """What the servicer sends back for ``requests``, the stream then ended by the sender."""
    async def sent() -> AsyncIterator[pb.ReportToolReturnsRequest]:
        for request in requests:
            yield request

    return [resp async for resp in SchedulerServicer(core).ToolReturns(sent(), None)]


async def test_only_the_batch_with_a_move_is_answered_and_the_last_when_the_sender_ends(
        store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec())
    await teach_one_group(core, 200)  # the tree says: after this return, long
    await core._tick(core._jobs[JOB])
    moving = sorted(await core._store.assignments(JOB))[0]
    out = await answers(core, [batch(1, "unknown-a"), batch(2, moving, "unknown-b"),
                               batch(3, "unknown-c"), batch(4, "unknown-d")])
    assert [resp.batch_id for resp in out] == [2, 4]
    assert [(d.action, d.target_instance) for d in out[0].decisions] == [
        (pb.DECISION_ACTION_MOVE, "rollout-1"), (pb.DECISION_ACTION_STAY, "")]
    assert [d.reason for d in out[1].decisions] == ["unknown_trajectory"]


async def test_stays_are_answered_when_asked_and_when_the_window_is_full(
        store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec())
    out = await answers(core, [batch(i, f"unknown-{i}", max_unanswered=2) for i in (1, 2, 3)]
                        + [batch(4, "unknown-4", answer_stays=True), batch(5, "unknown-5")])
    assert [resp.batch_id for resp in out] == [3, 4, 5]


async def test_every_batch_is_answered_with_no_window(store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec())
    out = await answers(core, [batch(i, "unknown", max_unanswered=0) for i in (1, 2, 3)])
    assert [resp.batch_id for resp in out] == [1, 2, 3]


async def test_a_refused_batch_and_a_failed_item_are_answered_at_once(
        store: MemorySchedulerStore) -> None:
    core = await started(store, cmlfq_spec())
    out = await answers(core, [batch(1, "unknown", epoch=5),
                               batch(2, "unknown", job_id="other-job"),
                               batch(3, "unknown"), batch(4, "unknown")])
    assert [resp.batch_id for resp in out] == [1, 2, 4]
    assert "stale lease epoch 5" in out[0].error
    assert out[1].decisions[0].error.startswith("FAILED_PRECONDITION")
