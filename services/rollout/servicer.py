"""gRPC shell of a rollout instance."""

from __future__ import annotations

from libra import types as t
from libra.proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
from libra.wire.rollout import instance_status_to_proto, lend_result_to_proto, reclaimed_to_proto
from services.rollout.core import RolloutCore
from services.rollout.engine_types import EngineCallLog


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, core: RolloutCore, engine_calls: EngineCallLog | None = None) -> None:
        self._core = core
        self._engine_calls = engine_calls

    async def GetInstanceStatus(self, request, context):  # noqa: N802, ANN001
        engine_calls = self._engine_calls.to_json() if self._engine_calls else ""
        return instance_status_to_proto(self._core.instance_status(engine_calls))

    async def Lend(self, request, context):  # noqa: N802, ANN001
        lease, handed = await self._core.lend(request.job_id, request.expected_epoch,
                                              request.generation, request.trainer_address)
        return lend_result_to_proto(t.LendResult(lease, handed))

    async def Reclaim(self, request, context):  # noqa: N802, ANN001
        lease = await self._core.reclaim(request.generation, request.reason)
        return reclaimed_to_proto(lease)
