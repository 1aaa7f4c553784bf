"""gRPC shell of a rollout instance."""

from __future__ import annotations

from libra.proto.rollout.v1 import rollout_pb2 as pb
from libra.proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
from services.rollout.core import RolloutCore


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, core: RolloutCore) -> None:
        self._core = core

    async def GetInstanceStatus(self, request, context):  # noqa: N802, ANN001
        core = self._core
        return pb.GetInstanceStatusResponse(
            instance_id=core.settings.instance_id, bucket=core.settings.bucket,
            active_trajectories=core.num_active, policy_version=core.policy_version,
            tokens_generated=core.tokens_generated, job_id=core.job_id)
