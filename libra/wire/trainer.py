"""Converters for ``trainer/v1`` (the trainer's status)."""

from __future__ import annotations

from libra import types as t
from libra.proto.trainer.v1 import trainer_pb2 as pb


def trainer_status_to_proto(status: t.TrainerStatus) -> pb.GetTrainerStatusResponse:
    """The trainer's status as its GetTrainerStatus response."""
    return pb.GetTrainerStatusResponse(job_id=status.job_id, step=status.step,
                                       policy_version=status.policy_version,
                                       phase=status.phase, message=status.message)


def trainer_status_from_proto(msg: pb.GetTrainerStatusResponse) -> t.TrainerStatus:
    """The trainer's status from its GetTrainerStatus response."""
    return t.TrainerStatus(job_id=msg.job_id, phase=msg.phase, step=msg.step,
                           policy_version=msg.policy_version, message=msg.message)
