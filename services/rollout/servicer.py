"""gRPC shell of a rollout instance."""

from __future__ import annotations

from libra.proto.rollout.v1 import rollout_pb2 as pb
from libra.proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
from libra.wire.common import lease_to_proto
from services.rollout.core import RolloutCore
from services.rollout.engine_types import EngineCallLog


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, core: RolloutCore, engine_calls: EngineCallLog | None = None) -> None:
        self._core = core
        self._engine_calls = engine_calls

    async def GetInstanceStatus(self, request, context):  # noqa: N802, ANN001
        core = self._core
        lease = core.lease
        return pb.GetInstanceStatusResponse(
            instance_id=core.settings.instance_id, bucket=core.settings.bucket,
            active_trajectories=core.num_active, policy_version=core.policy_version,
            tokens_generated=core.tokens_generated, job_id=core.job_id,
            role=lease.role.value if lease else "", hybrid_phase=core.hybrid_phase,
            engine_profile_json=self._engine_calls.to_json() if self._engine_calls else "",
            loop_profile_json=core.profile.to_json())

    async def Lend(self, request, context):  # noqa: N802, ANN001
        lease, handed = await self._core.lend(request.job_id, request.expected_epoch,
                                              request.generation, request.trainer_address)
        return pb.LendResponse(lease=lease_to_proto(lease), handed_back=handed)

    async def Reclaim(self, request, context):  # noqa: N802, ANN001
        lease = await self._core.reclaim(request.generation, request.reason)
        return pb.ReclaimResponse(lease=lease_to_proto(lease))
