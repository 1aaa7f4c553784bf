"""The scheduler client's tool-return stream against a scheduler that misbehaves: no
answer within the timeout, an answer that does not match the batch. Each fails the
batches out (the rollout stays) and the next batch goes on a fresh stream."""

from __future__ import annotations

import asyncio

import pytest

from libra import types as t
from libra.clients.runner import GrpcSchedulerClient
from libra.errors import Internal, Unavailable
from libra.proto.scheduler.v1 import scheduler_pb2 as pb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.service.grpc_harness import serving

STATE = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)


class _Misbehaving(pb_grpc.SchedulerServiceServicer):
    """Answers nothing (``silent``), or with no decisions, or (``answer_offset``) to a
    batch that was never sent."""

    def __init__(self, silent: bool, answer_offset: int = 0) -> None:
        self._silent = silent
        self._answer_offset = answer_offset
        self.batches: list[int] = []

    async def ToolReturns(self, request_iterator, context):  # noqa: N802, ANN001
        async for request in request_iterator:
            self.batches.append(request.batch_id)
            if self._silent:
                await asyncio.sleep(3600)
            yield pb.ReportToolReturnsResponse(batch_id=request.batch_id + self._answer_offset)


async def _report(client: GrpcSchedulerClient, trajectory_id: str) -> t.PlacementDecision:
    return await client.report_tool_return("j1", trajectory_id, STATE, 3, "rollout-0", 1)


@pytest.mark.parametrize("silent", [True, False], ids=["no_answer", "wrong_answer"])
async def test_a_bad_answer_fails_the_batch_and_the_next_goes_on_a_new_stream(
        silent: bool) -> None:
    servicer = _Misbehaving(silent)
    async with serving("scheduler", pb_grpc.add_SchedulerServiceServicer_to_server, servicer,
                       pb.DESCRIPTOR, "SchedulerService") as address:
        client = GrpcSchedulerClient(address, timeout_s=0.3)
        expected = (Unavailable, "no answer") if silent else (Internal, "0 decisions for 1")
        for trajectory_id in ("traj-0", "traj-1"):
            with pytest.raises(expected[0], match=expected[1]):
                await _report(client, trajectory_id)
        await client.close()
    assert servicer.batches == [1, 2]
    assert client.num_report_streams == 2


@pytest.mark.parametrize("silent", [True, False], ids=["no_answer_when_due", "unknown_batch"])
async def test_unanswered_batches_fail_with_the_stream(silent: bool) -> None:
    """Stays that need no answer are out unanswered until the window is full: then an
    answer is due, and a silent scheduler (or one answering a batch never sent) fails
    all of them."""
    servicer = _Misbehaving(silent, answer_offset=100)
    async with serving("scheduler", pb_grpc.add_SchedulerServiceServicer_to_server, servicer,
                       pb.DESCRIPTOR, "SchedulerService") as address:
        client = GrpcSchedulerClient(address, timeout_s=0.3, max_unanswered=1)
        quiet = []
        for trajectory_id in ("traj-0", "traj-1"):
            quiet.append(asyncio.create_task(client.report_tool_return(
                "j1", trajectory_id, STATE, 3, "rollout-0", 1, needs_answer=False)))
            await asyncio.sleep(0.05)  # each its own batch
        results = await asyncio.gather(*quiet, return_exceptions=True)
        await client.close()
    expected = (Unavailable, "no answer") if silent else (Internal, "which is not out")
    assert all(isinstance(r, expected[0]) and expected[1] in str(r) for r in results), results
