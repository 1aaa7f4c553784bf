"""gRPC shell of the scheduler: convert, delegate, convert."""

from __future__ import annotations

import json

from libra import types as t
from libra.proto.scheduler.v1 import scheduler_pb2 as pb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from libra.wire.common import tool_state_from_proto, traj_status_from_proto
from services.scheduler.core import SchedulerCore
from services.scheduler.metrics import record_decision

_ACTION = {
    t.DecisionAction.STAY: pb.DECISION_ACTION_STAY,
    t.DecisionAction.MOVE: pb.DECISION_ACTION_MOVE,
}


class SchedulerServicer(pb_grpc.SchedulerServiceServicer):
    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    async def StartJob(self, request, context):  # noqa: N802, ANN001
        await self._core.start_job(request.job_id)
        return pb.StartJobResponse()

    async def StopJob(self, request, context):  # noqa: N802, ANN001
        await self._core.stop_job(request.job_id)
        return pb.StopJobResponse()

    async def ReportToolReturn(self, request, context):  # noqa: N802, ANN001
        decision = await self._core.report_tool_return(
            request.job_id,
            request.trajectory_id,
            tool_state_from_proto(request.state),
            request.tokens_so_far,
        )
        record_decision(request.trajectory_id, decision)
        return pb.ReportToolReturnResponse(
            action=_ACTION[decision.action],
            target_bucket=decision.target_bucket,
            target_instance=decision.target_instance,
            reason=decision.reason,
        )

    async def ReportFinished(self, request, context):  # noqa: N802, ANN001
        await self._core.report_finished(
            request.job_id,
            request.trajectory_id,
            request.total_tokens,
            traj_status_from_proto(request.status),
        )
        return pb.ReportFinishedResponse()

    async def GetSchedulerStats(self, request, context):  # noqa: N802, ANN001
        stats = await self._core.stats(request.job_id)
        return pb.GetSchedulerStatsResponse(stats_json=json.dumps(stats))
