"""Typed clients of the two services that run a job: the trainer and the scheduler
(``GrpcSchedulerClient`` lives in ``libra.clients.scheduler``; re-exported here)."""

from __future__ import annotations

from libra import types as t
from libra.clients.base import GrpcClientBase
from libra.clients.scheduler import GrpcSchedulerClient
from libra.grpc_auth import ClientAuth
from libra.proto.trainer.v1 import trainer_pb2 as tpb
from libra.proto.trainer.v1 import trainer_pb2_grpc as tpb_grpc
from libra.wire.trainer import trainer_status_from_proto

__all__ = ["GrpcSchedulerClient", "GrpcTrainerClient"]


class GrpcTrainerClient(GrpcClientBase):
    """Starts, stops and asks after a job on the trainer (the coordinator's runner)."""

    def __init__(self, address: str, timeout_s: float = 10.0, *,
                 auth: ClientAuth | None = None) -> None:
        super().__init__(address, timeout_s, auth=auth)
        self._stub = tpb_grpc.TrainerServiceStub(self._channel)

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Start a job; ``resume`` continues it from its newest checkpoint (a RUNNING job
        no trainer holds, or a cancelled or failed one resumed)."""
        await self._call(self._stub.StartJob, tpb.StartJobRequest(job_id=job_id,
                                                                  resume=resume))

    async def stop_job(self, job_id: str) -> None:
        """Stop training ``job_id`` (idempotent: retried on UNAVAILABLE)."""
        await self._call(self._stub.StopJob, tpb.StopJobRequest(job_id=job_id),
                         idempotent=True)

    async def status(self) -> t.TrainerStatus:
        """What the trainer is doing: its phase, job, step and policy version (reconciliation)."""
        resp = await self._call(self._stub.GetTrainerStatus, tpb.GetTrainerStatusRequest(),
                                idempotent=True)
        return trainer_status_from_proto(resp)
