"""gRPC shell of the trainer's weight service (:mod:`services.trainer.weight_server`)."""

from __future__ import annotations

from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.proto.trainer.v1 import trainer_pb2_grpc as pb_grpc
from libra.wire.weights import chunk_to_proto, model_files_to_proto
from services.trainer.weight_server import WeightServer


class WeightServicer(pb_grpc.WeightServiceServicer):
    def __init__(self, server: WeightServer) -> None:
        self._server = server

    async def GetWeightManifest(self, request, context):  # noqa: N802, ANN001
        body = await self._server.get_manifest(request.job_id, request.version)
        return pb.GetWeightManifestResponse(manifest_json=body)

    async def FetchWeightChunks(self, request, context):  # noqa: N802, ANN001
        async for chunk in self._server.fetch_chunks(request.job_id, request.version,
                                                     request.from_chunk):
            yield chunk_to_proto(chunk)

    async def ListModelFiles(self, request, context):  # noqa: N802, ANN001
        return model_files_to_proto(await self._server.list_model_files(request.job_id))

    async def FetchModelFile(self, request, context):  # noqa: N802, ANN001
        async for chunk in self._server.fetch_model_file(request.job_id, request.name):
            yield chunk_to_proto(chunk)
