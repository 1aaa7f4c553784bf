"""Typed clients of the two services that run a job: the trainer and the scheduler."""

from __future__ import annotations

import json
from typing import Any

from libra import types as t
from libra.clients.base import GrpcClientBase
from libra.proto.scheduler.v1 import scheduler_pb2 as spb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from libra.proto.trainer.v1 import trainer_pb2 as tpb
from libra.proto.trainer.v1 import trainer_pb2_grpc as tpb_grpc
from libra.wire.common import tool_state_to_proto, traj_status_to_proto


class GrpcTrainerClient(GrpcClientBase):
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        super().__init__(address, timeout_s)
        self._stub = tpb_grpc.TrainerServiceStub(self._channel)

    async def start_job(self, job_id: str) -> None:
        await self._call(self._stub.StartJob, tpb.StartJobRequest(job_id=job_id))

    async def stop_job(self, job_id: str) -> None:
        await self._call(self._stub.StopJob, tpb.StopJobRequest(job_id=job_id),
                         idempotent=True)

    async def status(self) -> dict[str, Any]:
        resp = await self._call(self._stub.GetTrainerStatus, tpb.GetTrainerStatusRequest(),
                                idempotent=True)
        return {"job_id": resp.job_id, "step": resp.step,
                "policy_version": resp.policy_version, "phase": resp.phase}


_ACTION_IN = {spb.DECISION_ACTION_STAY: t.DecisionAction.STAY,
              spb.DECISION_ACTION_MOVE: t.DecisionAction.MOVE}


class GrpcSchedulerClient(GrpcClientBase):
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        super().__init__(address, timeout_s)
        self._stub = spb_grpc.SchedulerServiceStub(self._channel)

    async def start_job(self, job_id: str) -> None:
        await self._call(self._stub.StartJob, spb.StartJobRequest(job_id=job_id))

    async def stop_job(self, job_id: str) -> None:
        await self._call(self._stub.StopJob, spb.StopJobRequest(job_id=job_id),
                         idempotent=True)

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str) -> t.PlacementDecision:
        resp = await self._call(self._stub.ReportToolReturn, spb.ReportToolReturnRequest(
            job_id=job_id, trajectory_id=trajectory_id, state=tool_state_to_proto(state),
            tokens_so_far=tokens_so_far, instance_id=instance_id))
        return t.PlacementDecision(_ACTION_IN.get(resp.action, t.DecisionAction.STAY),
                                   resp.target_bucket, resp.target_instance, resp.reason)

    async def report_finished(self, job_id: str, trajectory_id: str, total_tokens: int,
                              status: t.TrajectoryStatus, instance_id: str) -> None:
        await self._call(self._stub.ReportFinished, spb.ReportFinishedRequest(
            job_id=job_id, trajectory_id=trajectory_id, total_tokens=total_tokens,
            status=traj_status_to_proto(status), instance_id=instance_id), idempotent=True)

    async def stats(self, job_id: str) -> dict[str, Any]:
        resp = await self._call(self._stub.GetSchedulerStats,
                                spb.GetSchedulerStatsRequest(job_id=job_id), idempotent=True)
        return json.loads(resp.stats_json or "{}")



