"""Rollout messages <-> ``libra.types``: an instance's status, and the lease a Lend or a
Reclaim answers with. Used by the rollout's servicer and by its client."""

from __future__ import annotations

from libra import types as t
from libra.proto.rollout.v1 import rollout_pb2 as pb
from libra.wire.common import lease_from_proto, lease_to_proto


def instance_status_to_proto(status: t.InstanceStatus) -> pb.GetInstanceStatusResponse:
    """An instance's status as the GetInstanceStatus response."""
    return pb.GetInstanceStatusResponse(
        instance_id=status.instance_id, bucket=status.bucket,
        active_trajectories=status.num_active_trajectories,
        policy_version=status.policy_version, tokens_generated=status.num_tokens_generated,
        job_id=status.job_id, role=status.role, hybrid_phase=status.hybrid_phase,
        engine_profile_json=status.engine_profile_json,
        loop_profile_json=status.loop_profile_json)


def instance_status_from_proto(msg: pb.GetInstanceStatusResponse) -> t.InstanceStatus:
    """An instance's status from the GetInstanceStatus response."""
    return t.InstanceStatus(
        instance_id=msg.instance_id, bucket=msg.bucket,
        num_active_trajectories=msg.active_trajectories, policy_version=msg.policy_version,
        num_tokens_generated=msg.tokens_generated, job_id=msg.job_id, role=msg.role,
        hybrid_phase=msg.hybrid_phase, engine_profile_json=msg.engine_profile_json,
        loop_profile_json=msg.loop_profile_json)


def lend_result_to_proto(result: t.LendResult) -> pb.LendResponse:
    """A lend's outcome as the Lend response."""
    return pb.LendResponse(lease=lease_to_proto(result.lease),
                           handed_back=result.num_handed_back)


def lend_result_from_proto(msg: pb.LendResponse) -> t.LendResult:
    """A lend's outcome from the Lend response."""
    return t.LendResult(lease_from_proto(msg.lease), msg.handed_back)


def reclaimed_to_proto(lease: t.Lease) -> pb.ReclaimResponse:
    """The lease after a reclaim as the Reclaim response."""
    return pb.ReclaimResponse(lease=lease_to_proto(lease))


def reclaimed_from_proto(msg: pb.ReclaimResponse) -> t.Lease:
    """The lease after a reclaim from the Reclaim response."""
    return lease_from_proto(msg.lease)
