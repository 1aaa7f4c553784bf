"""Converters for ``coordinator/v1``."""

from __future__ import annotations

from collections.abc import Sequence

from libra import types as t
from libra.errors import InvalidArgument
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.wire.common import lease_from_proto, lease_to_proto

_STATE = {t.JobState.PENDING: pb.JOB_STATE_PENDING, t.JobState.RUNNING: pb.JOB_STATE_RUNNING,
          t.JobState.SUCCEEDED: pb.JOB_STATE_SUCCEEDED, t.JobState.FAILED: pb.JOB_STATE_FAILED,
          t.JobState.CANCELLED: pb.JOB_STATE_CANCELLED}
_STATE_IN = {v: k for k, v in _STATE.items()}


def job_state_to_proto(state: t.JobState) -> int:
    """The proto enum value of a job state."""
    return _STATE[state]


def job_state_from_proto(value: int) -> t.JobState:
    """A job state from its proto value; InvalidArgument("state") for an unknown one."""
    if value not in _STATE_IN:
        raise InvalidArgument("state", "must be a known job state")
    return _STATE_IN[value]


_FIELDS = ("job_id", "name", "spec_json", "created_at_ms", "updated_at_ms", "message", "step",
           "policy_version", "run_dir", "priority", "queue_position", "num_resumes")


def job_to_proto(job: t.Job) -> pb.Job:
    """A job as its proto message."""
    return pb.Job(state=_STATE[job.state], **{f: getattr(job, f) for f in _FIELDS})


def job_from_proto(msg: pb.Job) -> t.Job:
    """A job from its proto message."""
    return t.Job(state=job_state_from_proto(msg.state), **{f: getattr(msg, f) for f in _FIELDS})


_OUTCOME = {t.RenewOutcome.RENEWED: pb.RENEW_OUTCOME_RENEWED,
            t.RenewOutcome.GONE: pb.RENEW_OUTCOME_GONE,
            t.RenewOutcome.FENCED: pb.RENEW_OUTCOME_FENCED}
_OUTCOME_IN = {v: k for k, v in _OUTCOME.items()}


def lease_refs_to_proto(refs: Sequence[t.LeaseRef]) -> pb.RenewLeasesRequest:
    """A batched renewal's request."""
    return pb.RenewLeasesRequest(leases=[pb.LeaseRef(worker_id=r.worker_id, epoch=r.epoch)
                                         for r in refs])


def lease_refs_from_proto(msg: pb.RenewLeasesRequest) -> list[t.LeaseRef]:
    """The leases a batched renewal names, in order."""
    return [t.LeaseRef(r.worker_id, r.epoch) for r in msg.leases]


def renewals_to_proto(renewals: Sequence[t.LeaseRenewal]) -> pb.RenewLeasesResponse:
    """A batched renewal's answers, in order."""
    return pb.RenewLeasesResponse(renewals=[pb.LeaseRenewal(
        worker_id=r.worker_id, epoch=r.epoch, outcome=_OUTCOME[r.outcome],
        lease=None if r.lease is None else lease_to_proto(r.lease)) for r in renewals])


def renewals_from_proto(msg: pb.RenewLeasesResponse) -> list[t.LeaseRenewal]:
    """A batched renewal's answers; InvalidArgument("outcome") for an unknown outcome."""
    out = []
    for r in msg.renewals:
        if r.outcome not in _OUTCOME_IN:
            raise InvalidArgument("outcome", "must be a known renewal outcome")
        out.append(t.LeaseRenewal(r.worker_id, r.epoch, _OUTCOME_IN[r.outcome],
                                  lease_from_proto(r.lease) if r.HasField("lease") else None))
    return out
