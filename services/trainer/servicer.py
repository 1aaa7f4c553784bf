"""gRPC shell of the trainer."""

from __future__ import annotations

from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.proto.trainer.v1 import trainer_pb2_grpc as pb_grpc
from services.trainer.core import TrainerCore


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, core: TrainerCore) -> None:
        self._core = core

    async def StartJob(self, request, context):  # noqa: N802, ANN001
        await self._core.start_job(request.job_id)
        return pb.StartJobResponse()

    async def StopJob(self, request, context):  # noqa: N802, ANN001
        await self._core.stop_job(request.job_id)
        return pb.StopJobResponse()

    async def GetTrainerStatus(self, request, context):  # noqa: N802, ANN001
        core = self._core
        return pb.GetTrainerStatusResponse(job_id=core.job_id, step=core.step,
                                           policy_version=core.policy_version, phase=core.phase)
