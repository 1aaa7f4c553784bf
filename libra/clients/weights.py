"""Typed client of the trainer's weight service: published versions over gRPC.

The rollout's weight fetcher (services/rollout/weight_fetcher.py) drives it: one
manifest call, then one chunk stream per attempt. Retries (a full server, a broken
stream) are the fetcher's, which knows where to resume; this client only maps errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from libra.clients.api import WeightApi as WeightApi  # re-exported
from libra.clients.base import GrpcClientBase
from libra.errors import error_from_status
from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.proto.trainer.v1 import trainer_pb2_grpc as pb_grpc
from libra.weight_sync import ModelFile, WeightChunk
from libra.wire.weights import chunk_from_proto, model_files_from_proto

# Deadline of one chunk stream: a whole checkpoint over a slow link. The fetcher's own
# deadline (the rollout's weight_load_deadline_s) is what bounds a load.
STREAM_TIMEOUT_S = 3600.0


class GrpcWeightClient(GrpcClientBase):
    """The trainer's ``WeightService`` over one channel."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._stub = pb_grpc.WeightServiceStub(self._channel)

    async def get_manifest(self, job_id: str, version: int) -> bytes:
        """The exact bytes of ``version``'s manifest (NotFound when not published)."""
        reply = await self._call(self._stub.GetWeightManifest,
                                 pb.GetWeightManifestRequest(job_id=job_id, version=version),
                                 idempotent=True)
        return reply.manifest_json

    async def fetch_chunks(self, job_id: str, version: int,
                           from_chunk: int) -> AsyncIterator[WeightChunk]:
        """The chunks from ``from_chunk`` on; a broken stream raises the domain error
        (Unavailable when the trainer went away, ResourceExhausted when it is full)."""
        call = self._stub.FetchWeightChunks(
            pb.FetchWeightChunksRequest(job_id=job_id, version=version,
                                        from_chunk=from_chunk),
            timeout=STREAM_TIMEOUT_S)
        async for chunk in _chunks(call):
            yield chunk

    async def list_model_files(self, job_id: str) -> list[ModelFile]:
        """The files of the job's model directory (NotFound when it has none)."""
        reply = await self._call(self._stub.ListModelFiles,
                                 pb.ListModelFilesRequest(job_id=job_id), idempotent=True)
        return model_files_from_proto(reply)

    async def fetch_model_file(self, job_id: str, name: str) -> AsyncIterator[WeightChunk]:
        """One file of the job's model directory, in chunks (errors as fetch_chunks)."""
        call = self._stub.FetchModelFile(pb.FetchModelFileRequest(job_id=job_id, name=name),
                                         timeout=STREAM_TIMEOUT_S)
        async for chunk in _chunks(call):
            yield chunk


async def _chunks(call) -> AsyncIterator[WeightChunk]:  # noqa: ANN001
    """The chunks of a server stream, its failure as the domain error."""
    try:
        async for msg in call:
            yield chunk_from_proto(msg)
    except grpc.aio.AioRpcError as exc:
        raise error_from_status(exc.code().name, exc.details() or "") from exc
    finally:
        call.cancel()
