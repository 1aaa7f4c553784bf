"""Converters of the elastic gradient channel (``trainer/v1`` GradientChannel).

Gradients and merged updates are split into ``CHUNK_BYTES`` pieces so that no message
comes near gRPC's default 4 MiB limit whatever the model size; the assemblers put them
back together and hand over one whole domain message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from libra.errors import InvalidArgument
from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.training import channel as ch
from libra.training.samples import TrainSample
from libra.types import GroupId, TrajectoryId

CHUNK_BYTES = 1 << 20


def _chunks(data: bytes) -> Iterator[tuple[bytes, bool]]:
    if not data:
        yield b"", True
        return
    for start in range(0, len(data), CHUNK_BYTES):
        end = start + CHUNK_BYTES
        yield data[start:end], end >= len(data)


def _sample_to_pb(sample: TrainSample) -> pb.TrainSample:
    return pb.TrainSample(token_ids=sample.token_ids, loss_mask=sample.loss_mask,
                          rollout_logprobs=sample.rollout_logprobs, advantage=sample.advantage,
                          group_id=sample.group_id, trajectory_id=sample.trajectory_id)


def _sample_from_pb(msg: pb.TrainSample) -> TrainSample:
    return TrainSample(token_ids=list(msg.token_ids), loss_mask=list(msg.loss_mask),
                       rollout_logprobs=list(msg.rollout_logprobs), advantage=msg.advantage,
                       group_id=GroupId(msg.group_id),
                       trajectory_id=TrajectoryId(msg.trajectory_id))


# -- hybrid -> core ---------------------------------------------------------------------


def hybrid_to_pb(msg: ch.HybridMessage) -> Iterator[pb.HybridMessage]:
    """A hybrid's message as stream pieces (a gradient split into chunks under the message
    limit)."""
    if isinstance(msg, ch.Hello):
        yield pb.HybridMessage(hello=pb.HybridHello(
            job_id=msg.job_id, worker_id=msg.worker_id, epoch=msg.epoch,
            generation=msg.generation))
    elif isinstance(msg, ch.Applied):
        yield pb.HybridMessage(applied=pb.StateApplied(step=msg.step, checksum=msg.checksum))
    elif isinstance(msg, ch.Activated):
        yield pb.HybridMessage(activated=pb.Activated(epoch=msg.epoch, step=msg.step))
    else:
        for piece, last in _chunks(msg.data):
            yield pb.HybridMessage(gradient=pb.GradientChunk(
                step=msg.step, policy_version=msg.policy_version, epoch=msg.epoch,
                slice_id=msg.slice_id, data=piece, last=last,
                metrics_json=json.dumps(msg.metrics) if last else "",
                non_finite=msg.non_finite))


class HybridAssembler:
    """Turns the core's incoming stream back into whole hybrid messages."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, msg: pb.HybridMessage) -> ch.HybridMessage | None:
        """Take one piece; the whole message once its last piece arrived, else None."""
        kind = msg.WhichOneof("body")
        if kind == "hello":
            h = msg.hello
            if not h.worker_id:
                raise InvalidArgument("hello.worker_id", "must not be empty")
            return ch.Hello(h.job_id, h.worker_id, h.epoch, h.generation)
        if kind == "applied":
            return ch.Applied(msg.applied.step, msg.applied.checksum)
        if kind == "activated":
            return ch.Activated(msg.activated.epoch, msg.activated.step)
        if kind != "gradient":
            raise InvalidArgument("body", "expected hello, applied, activated or gradient")
        g = msg.gradient
        self._parts.append(g.data)
        if not g.last:
            return None
        data, self._parts = b"".join(self._parts), []
        return ch.GradientPayload(g.step, g.policy_version, g.epoch, g.slice_id, data,
                                  json.loads(g.metrics_json or "{}"), g.non_finite)


# -- core -> hybrid ---------------------------------------------------------------------


def core_to_pb(msg: ch.CoreMessage) -> Iterator[pb.CoreMessage]:
    """A core's message as stream pieces (an update's gradient split into chunks under the
    message limit)."""
    if isinstance(msg, ch.Snapshot):
        yield pb.CoreMessage(snapshot=pb.StateSnapshot(
            directory=msg.directory, step=msg.step, policy_version=msg.policy_version,
            spec_json=msg.spec_json))
    elif isinstance(msg, ch.Update):
        for piece, last in _chunks(msg.data):
            yield pb.CoreMessage(update=pb.UpdateChunk(step=msg.step, data=piece, last=last,
                                                       skipped=msg.skipped, lr=msg.lr))
    elif isinstance(msg, ch.Offer):
        yield pb.CoreMessage(offer=pb.ActivateOffer(step=msg.step))
    elif isinstance(msg, ch.SliceTask):
        yield pb.CoreMessage(task=pb.SliceTask(
            step=msg.step, policy_version=msg.policy_version, epoch=msg.epoch,
            slice_id=msg.slice_id, scale=msg.scale,
            samples=[_sample_to_pb(s) for s in msg.samples]))
    else:
        yield pb.CoreMessage(detach=pb.Detach(reason=msg.reason))


class CoreAssembler:
    """Turns the hybrid's incoming stream back into whole core messages."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, msg: pb.CoreMessage) -> ch.CoreMessage | None:
        """Take one piece; the whole message once complete, else None."""
        kind = msg.WhichOneof("body")
        if kind == "snapshot":
            s = msg.snapshot
            return ch.Snapshot(s.directory, s.step, s.policy_version, s.spec_json)
        if kind == "offer":
            return ch.Offer(msg.offer.step)
        if kind == "task":
            task = msg.task
            return ch.SliceTask(task.step, task.policy_version, task.epoch, task.slice_id,
                                task.scale, [_sample_from_pb(s) for s in task.samples])
        if kind == "detach":
            return ch.Detach(msg.detach.reason)
        if kind != "update":
            raise InvalidArgument("body", "expected snapshot, update, offer, task or detach")
        u = msg.update
        self._parts.append(u.data)
        if not u.last:
            return None
        data, self._parts = b"".join(self._parts), []
        return ch.Update(u.step, data, u.skipped, u.lr)
