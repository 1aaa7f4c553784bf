"""gRPC shell of the scheduler: convert, delegate, convert."""

from __future__ import annotations

import contextlib
import time

from libra.errors import LibraError
from libra.proto.scheduler.v1 import scheduler_pb2 as pb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from libra.telemetry import spans_recorded, tracer
from libra.wire.common import traj_status_from_proto
from libra.wire.scheduler import (
    decision_to_proto,
    decision_to_response,
    error_to_text,
    report_from_proto,
    stats_to_proto,
)
from services.scheduler.core import SchedulerCore
from services.scheduler.metrics import (
    observe_decide_batch,
    observe_tick_wait,
    record_decision,
    record_decisions,
)

_TRACER = tracer(__name__)

class SchedulerServicer(pb_grpc.SchedulerServiceServicer):
    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    async def StartJob(self, request, context):  # noqa: N802, ANN001
        await self._core.start_job(request.job_id, resume=request.resume)
        return pb.StartJobResponse()

    async def StopJob(self, request, context):  # noqa: N802, ANN001
        await self._core.stop_job(request.job_id)
        return pb.StopJobResponse()

    async def ReportToolReturn(self, request, context):  # noqa: N802, ANN001
        await self._core.tick_done()  # as a batch: the tick goes first
        (decision,) = await self._core.report_tool_returns(
            request.instance_id, request.lease_epoch, [report_from_proto(request)])
        if isinstance(decision, LibraError):
            raise decision
        record_decision(request.trajectory_id, decision)
        return decision_to_response(decision)

    async def ToolReturns(self, request_iterator, context):  # noqa: N802, ANN001
        # One stream per rollout instance for its lifetime: a refused batch is answered
        # (its error in the response), never a reason to end the stream. Most batches
        # are all stays, which change nothing at the instance: they go unanswered (up to
        # the sender's max_unanswered in a row), a message saved per batch.
        unanswered = 0
        held: pb.ReportToolReturnsResponse | None = None  # the last batch's, unsent
        async for request in request_iterator:
            # A span per batch (the stream's own span lives as long as the instance),
            # closed before the yield: a context must not stay attached across it.
            with _batch_span():
                response = await self._decide_batch(request)
            if unanswered < request.max_unanswered and not _must_answer(request, response):
                unanswered, held = unanswered + 1, response
                continue
            unanswered, held = 0, None
            yield response
        if held is not None:  # the sender is closing: confirm its last stays
            yield held

    async def _decide_batch(self, request: pb.ReportToolReturnsRequest,
                            ) -> pb.ReportToolReturnsResponse:
        waited_s = time.perf_counter()
        await self._core.tick_done()  # the tick goes first (core.tick_done says why)
        began_s = time.perf_counter()
        observe_tick_wait(began_s - waited_s)
        reports = [report_from_proto(r) for r in request.reports]
        try:
            results = await self._core.report_tool_returns(request.instance_id,
                                                           request.lease_epoch, reports)
        except LibraError as exc:
            return pb.ReportToolReturnsResponse(batch_id=request.batch_id,
                                                error=error_to_text(exc))
        finally:
            observe_decide_batch(time.perf_counter() - began_s)
        record_decisions([(report.trajectory_id, result) for report, result
                          in zip(reports, results, strict=True)
                          if not isinstance(result, LibraError)])
        return pb.ReportToolReturnsResponse(
            batch_id=request.batch_id, decisions=[decision_to_proto(r) for r in results])

    async def ReportFinished(self, request, context):  # noqa: N802, ANN001
        await self._core.check_fence(request.instance_id, request.lease_epoch)
        await self._core.report_finished(
            request.job_id,
            request.trajectory_id,
            request.total_tokens,
            traj_status_from_proto(request.status),
        )
        return pb.ReportFinishedResponse()

    async def GetSchedulerStats(self, request, context):  # noqa: N802, ANN001
        stats = await self._core.stats(request.job_id)
        return stats_to_proto(stats)


def _batch_span() -> contextlib.AbstractContextManager[object]:
    """The batch's span where spans are recorded; none otherwise (the no-op span and its
    context cost ~4 us a batch, ~1,000 batches a second at 1,000 instances)."""
    if spans_recorded():
        return _TRACER.start_as_current_span("scheduler.ToolReturns.batch")
    return contextlib.nullcontext()


def _must_answer(request: pb.ReportToolReturnsRequest,
                 response: pb.ReportToolReturnsResponse) -> bool:
    """A batch that asks for it, was refused, or holds a move or a failed item."""
    return (request.answer_stays or bool(response.error)
            or any(d.action == pb.DECISION_ACTION_MOVE or d.error
                   for d in response.decisions))
