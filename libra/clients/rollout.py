"""Typed client of one rollout instance: its status, and lending it to training.

The coordinator's elastic executor uses ``lend`` and ``reclaim`` to move a hybrid-rollout
instance into the trainer's gradient domain and back (docs/architecture.md, elastic
hybrid pool). Both carry a join generation: a newer call makes an older join stale.
"""

from __future__ import annotations

from libra import types as t
from libra.clients.api import InstanceStatus as InstanceStatus
from libra.clients.api import LendResult as LendResult
from libra.clients.api import RolloutApi as RolloutApi
from libra.clients.base import GrpcClientBase
from libra.grpc_auth import ClientAuth
from libra.proto.rollout.v1 import rollout_pb2 as pb
from libra.proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
from libra.wire.rollout import (
    instance_status_from_proto,
    lend_result_from_proto,
    reclaimed_from_proto,
)


class GrpcRolloutClient(GrpcClientBase):
    """One rollout instance over gRPC."""

    def __init__(self, address: str, timeout_s: float = 10.0, *,
                 auth: ClientAuth | None = None) -> None:
        super().__init__(address, timeout_s, auth=auth)
        self._stub = pb_grpc.RolloutServiceStub(self._channel)

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendResult:
        """Start lending the instance (returns once it is hybrid-joining).

        Not retried: the caller cannot know whether a lost reply applied; it rolls back
        with ``reclaim`` at a newer generation instead.
        """
        resp = await self._call(self._stub.Lend, pb.LendRequest(
            job_id=job_id, expected_epoch=expected_epoch, generation=generation,
            trainer_address=trainer_address), timeout_s=timeout_s)
        return lend_result_from_proto(resp)

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease:
        """Cancel a pending join or detach an active one (idempotent per generation)."""
        resp = await self._call(self._stub.Reclaim, pb.ReclaimRequest(
            generation=generation, reason=reason), idempotent=True, timeout_s=timeout_s)
        return reclaimed_from_proto(resp)

    async def get_instance_status(self) -> InstanceStatus:
        """What the instance is doing now (for the planner and ``libra status``), with the
        engine and loop profiles it timed."""
        resp = await self._call(self._stub.GetInstanceStatus, pb.GetInstanceStatusRequest(),
                                idempotent=True)
        return instance_status_from_proto(resp)
