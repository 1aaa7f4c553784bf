"""Converters for messages in ``common/v1``."""

from __future__ import annotations

from libra import types as t
from libra.proto.common.v1 import common_pb2 as pb

_TOOL_STATUS = {t.ToolStatus.SUCCESS: pb.TOOL_STATUS_SUCCESS,
                t.ToolStatus.FAILURE: pb.TOOL_STATUS_FAILURE,
                t.ToolStatus.TIMEOUT: pb.TOOL_STATUS_TIMEOUT}
_SIZE = {t.SizeClass.SMALL: pb.SIZE_CLASS_SMALL, t.SizeClass.MEDIUM: pb.SIZE_CLASS_MEDIUM,
         t.SizeClass.LARGE: pb.SIZE_CLASS_LARGE}
_TRAJ_STATUS = {t.TrajectoryStatus.RUNNING: pb.TRAJECTORY_STATUS_RUNNING,
                t.TrajectoryStatus.FINISHED: pb.TRAJECTORY_STATUS_FINISHED,
                t.TrajectoryStatus.FAILED: pb.TRAJECTORY_STATUS_FAILED}
_ROLE = {t.WorkerRole.CORE_ROLLOUT: pb.WORKER_ROLE_CORE_ROLLOUT,
         t.WorkerRole.CORE_TRAINING: pb.WORKER_ROLE_CORE_TRAINING,
         t.WorkerRole.HYBRID_ROLLOUT: pb.WORKER_ROLE_HYBRID_ROLLOUT,
         t.WorkerRole.HYBRID_JOINING: pb.WORKER_ROLE_HYBRID_JOINING,
         t.WorkerRole.HYBRID_TRAINING: pb.WORKER_ROLE_HYBRID_TRAINING,
         t.WorkerRole.SERVICE: pb.WORKER_ROLE_SERVICE}


def _inverse(table: dict) -> dict:
    return {v: k for k, v in table.items()}


_TOOL_STATUS_IN = _inverse(_TOOL_STATUS)
_SIZE_IN = _inverse(_SIZE)
_TRAJ_STATUS_IN = _inverse(_TRAJ_STATUS)
_ROLE_IN = _inverse(_ROLE)


def tool_status_to_proto(status: t.ToolStatus) -> int:
    """The proto enum value of a tool call's status."""
    return _TOOL_STATUS[status]


def tool_status_from_proto(value: int) -> t.ToolStatus:
    """A tool status from its proto value; an unknown value counts as a failure."""
    return _TOOL_STATUS_IN.get(value, t.ToolStatus.FAILURE)


def traj_status_to_proto(status: t.TrajectoryStatus) -> int:
    """The proto enum value of a trajectory's status."""
    return _TRAJ_STATUS[status]


def traj_status_from_proto(value: int) -> t.TrajectoryStatus:
    """A trajectory status from its proto value (unknown: running)."""
    return _TRAJ_STATUS_IN.get(value, t.TrajectoryStatus.RUNNING)


def role_to_proto(role: t.WorkerRole) -> int:
    """The proto enum value of a worker role."""
    return _ROLE[role]


def role_from_proto(value: int) -> t.WorkerRole:
    """A worker role from its proto value; InvalidArgument("role") for an unknown one."""
    if value not in _ROLE_IN:
        from libra.errors import InvalidArgument

        raise InvalidArgument("role", "must be a known worker role")
    return _ROLE_IN[value]


def tool_state_to_proto(state: t.ToolReturnState) -> pb.ToolReturnState:
    """A tool return's causal state as its proto message."""
    return pb.ToolReturnState(tool_type=state.tool_type, size_class=_SIZE[state.size_class],
                              status=_TOOL_STATUS[state.status])


def tool_state_from_proto(msg: pb.ToolReturnState) -> t.ToolReturnState:
    """A tool return's causal state from its proto message (unknown size: small)."""
    return t.ToolReturnState(msg.tool_type, _SIZE_IN.get(msg.size_class, t.SizeClass.SMALL),
                             tool_status_from_proto(msg.status))


_TRAJ_SCALARS = ("trajectory_id", "job_id", "group_id", "prompt_id", "prompt_text",
                 "reference", "failure_reason", "num_prompt_tokens", "reward", "num_turns",
                 "instance_id", "bucket", "num_migrations", "created_at_ms",
                 "finished_at_ms", "final_text", "attempt", "partial_turn_tokens",
                 "prompt_messages_json", "metadata_json", "eval_round", "traceparent")
_TRAJ_LISTS = ("token_ids", "loss_mask", "logprobs", "token_versions",
               "tool_return_positions")


def trajectory_to_proto(traj: t.Trajectory) -> pb.Trajectory:
    """A trajectory as its proto message (also its Redis encoding, :func:`encode_trajectory`)."""
    msg = pb.Trajectory(status=_TRAJ_STATUS[traj.status],
                        **{name: getattr(traj, name) for name in _TRAJ_SCALARS})
    for name in _TRAJ_LISTS:
        getattr(msg, name).extend(getattr(traj, name))
    msg.tool_states.extend(tool_state_to_proto(s) for s in traj.tool_states)
    msg.reward_components.update(traj.reward_components)
    msg.segments.extend(_segment_to_proto(seg) for seg in traj.segments)
    return msg


_SEGMENT_LISTS = ("token_ids", "loss_mask", "logprobs", "token_versions")


def _segment_to_proto(seg: t.Segment) -> pb.TrajectorySegment:
    msg = pb.TrajectorySegment(num_prompt_tokens=seg.num_prompt_tokens)
    for name in _SEGMENT_LISTS:
        getattr(msg, name).extend(getattr(seg, name))
    return msg


def _segment_from_proto(msg: pb.TrajectorySegment) -> t.Segment:
    return t.Segment(num_prompt_tokens=msg.num_prompt_tokens,
                     **{name: list(getattr(msg, name)) for name in _SEGMENT_LISTS})


def trajectory_from_proto(msg: pb.Trajectory) -> t.Trajectory:
    """A trajectory from its proto message."""
    traj = t.Trajectory(**{name: getattr(msg, name) for name in _TRAJ_SCALARS})
    traj.status = traj_status_from_proto(msg.status)
    for name in _TRAJ_LISTS:
        setattr(traj, name, list(getattr(msg, name)))
    traj.tool_states = [tool_state_from_proto(s) for s in msg.tool_states]
    traj.reward_components = dict(msg.reward_components)
    traj.segments = [_segment_from_proto(s) for s in msg.segments]
    return traj


def encode_trajectory(traj: t.Trajectory) -> bytes:
    """Bytes for a Redis stream entry (a serialised common.v1.Trajectory)."""
    return trajectory_to_proto(traj).SerializeToString()


def decode_trajectory(data: bytes) -> t.Trajectory:
    """A trajectory from the bytes :func:`encode_trajectory` wrote (Redis streams)."""
    return trajectory_from_proto(pb.Trajectory.FromString(data))


def lease_to_proto(lease: t.Lease) -> pb.Lease:
    """A lease as its proto message."""
    return pb.Lease(worker_id=lease.worker_id, role=_ROLE[lease.role], bucket=lease.bucket,
                    address=lease.address, epoch=lease.epoch,
                    expires_at_ms=lease.expires_at_ms, ttl_ms=lease.ttl_ms)


def lease_from_proto(msg: pb.Lease) -> t.Lease:
    """A lease from its proto message; InvalidArgument("role") for an unknown role."""
    return t.Lease(t.WorkerId(msg.worker_id), role_from_proto(msg.role), msg.bucket,
                   msg.address, msg.epoch, msg.expires_at_ms, msg.ttl_ms)
