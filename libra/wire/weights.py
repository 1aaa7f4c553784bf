"""Converters for the trainer's ``WeightService`` (published versions over gRPC)."""

from __future__ import annotations

from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.weight_sync import WeightChunk


def chunk_to_proto(chunk: WeightChunk) -> pb.WeightChunk:
    """One chunk of a weights file as a stream message."""
    return pb.WeightChunk(index=chunk.index, data=chunk.data)


def chunk_from_proto(msg: pb.WeightChunk) -> WeightChunk:
    """One chunk of a weights file from a stream message."""
    return WeightChunk(index=msg.index, data=msg.data)
