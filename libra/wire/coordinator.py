"""Converters for ``coordinator/v1``."""

from __future__ import annotations

from libra import types as t
from libra.errors import InvalidArgument
from libra.proto.coordinator.v1 import coordinator_pb2 as pb

_STATE = {t.JobState.PENDING: pb.JOB_STATE_PENDING, t.JobState.RUNNING: pb.JOB_STATE_RUNNING,
          t.JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED, t.JobState.FAILED: pb.JOB_STATE_FAILED,
          t.JobState.CANCELLED: pb.JOB_STATE_CANCELLED}
_STATE_IN = {v: k for k, v in _STATE.items()}


def job_state_to_proto(state: t.JobState) -> int:
    return _STATE[state]


def job_state_from_proto(value: int) -> t.JobState:
    if value not in _STATE_IN:
        raise InvalidArgument("state", "must be a known job state")
    return _STATE_IN[value]


_FIELDS = ("job_id", "name", "spec_json", "created_at_ms", "updated_at_ms", "message", "step",
           "policy_version", "run_dir", "priority", "queue_position", "num_resumes")


def job_to_proto(job: t.Job) -> pb.Job:
    return pb.Job(state=_STATE[job.state], **{f: getattr(job, f) for f in _FIELDS})


def job_from_proto(msg: pb.Job) -> t.Job:
    return t.Job(state=job_state_from_proto(msg.state), **{f: getattr(msg, f) for f in _FIELDS})
