"""Converters for the trainer's ``WeightService`` (published versions over gRPC)."""

from __future__ import annotations

from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.weight_sync import ModelFile, WeightChunk


def chunk_to_proto(chunk: WeightChunk) -> pb.WeightChunk:
    """One chunk of a weights file as a stream message."""
    return pb.WeightChunk(index=chunk.index, data=chunk.data)


def chunk_from_proto(msg: pb.WeightChunk) -> WeightChunk:
    """One chunk of a weights file from a stream message."""
    return WeightChunk(index=msg.index, data=msg.data)


def model_files_to_proto(files: list[ModelFile]) -> pb.ListModelFilesResponse:
    """The files of a job's model directory as a ListModelFiles response."""
    return pb.ListModelFilesResponse(files=[
        pb.ModelFile(name=f.name, size_bytes=f.size_bytes, sha256=f.sha256) for f in files])


def model_files_from_proto(msg: pb.ListModelFilesResponse) -> list[ModelFile]:
    """The files of a job's model directory from a ListModelFiles response."""
    return [ModelFile(f.name, f.size_bytes, f.sha256) for f in msg.files]
