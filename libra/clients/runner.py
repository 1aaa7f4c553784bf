"""Typed clients of the two services that run a job: the trainer and the scheduler
(``GrpcSchedulerClient`` lives in ``libra.clients.scheduler``; re-exported here)."""

from __future__ import annotations

from typing import Any

from libra.clients.base import GrpcClientBase
from libra.clients.scheduler import GrpcSchedulerClient
from libra.proto.trainer.v1 import trainer_pb2 as tpb
from libra.proto.trainer.v1 import trainer_pb2_grpc as tpb_grpc

__all__ = ["GrpcSchedulerClient", "GrpcTrainerClient"]


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
