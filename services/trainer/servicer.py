"""gRPC shell of the trainer."""

from __future__ import annotations

import asyncio

from libra.errors import InvalidArgument
from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.proto.trainer.v1 import trainer_pb2_grpc as pb_grpc
from libra.training import channel as ch
from libra.wire.gradient import HybridAssembler, core_to_pb
from libra.wire.trainer import trainer_status_to_proto
from services.trainer.core import TrainerCore
from services.trainer.elastic import HybridSession
from services.trainer.elastic_step import ElasticTrainer


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, core: TrainerCore) -> None:
        self._core = core

    async def StartJob(self, request, context):  # noqa: N802, ANN001
        await self._core.start_job(request.job_id, resume=request.resume)
        return pb.StartJobResponse()

    async def StopJob(self, request, context):  # noqa: N802, ANN001
        await self._core.stop_job(request.job_id)
        return pb.StopJobResponse()

    async def GetTrainerStatus(self, request, context):  # noqa: N802, ANN001
        return trainer_status_to_proto(self._core.status())


class GradientChannelServicer(pb_grpc.GradientChannelServicer):
    """One stream per lent worker: converts, assembles chunks and delegates to the core.

    The first message must be a hello. The stream's end - the hybrid went away, was
    killed or released - detaches the hybrid at once, so a step waiting for its payload
    re-assigns the slice without waiting out the deadline.
    """

    def __init__(self, core: TrainerCore | ElasticTrainer) -> None:
        # The trainer core checks the job first; a bare ElasticTrainer (benchmarks,
        # channel tests) takes every hello.
        self._core = core

    async def Exchange(self, request_iterator, context):  # noqa: N802, ANN001
        assembler = HybridAssembler()
        first = await anext(aiter(request_iterator), None)
        hello = assembler.feed(first) if first is not None else None
        if not isinstance(hello, ch.Hello):
            raise InvalidArgument("body", "the first message must be a hello")
        session = self._core.connect_hybrid(hello)
        reader = asyncio.create_task(self._read(request_iterator, assembler, session))
        try:
            while True:
                msg = await _next_outgoing(session, reader)
                if msg is None:
                    return
                for piece in core_to_pb(msg):
                    yield piece
                if isinstance(msg, ch.Detach):
                    return
        finally:
            reader.cancel()
            self._core.disconnect_hybrid(session, "gradient stream closed")

    async def _read(self, request_iterator, assembler: HybridAssembler,  # noqa: ANN001
                    session: HybridSession) -> None:
        async for piece in request_iterator:
            msg = assembler.feed(piece)
            if msg is not None:
                self._core.elastic_message(session, msg)


async def _next_outgoing(session: HybridSession, reader: asyncio.Task) -> ch.CoreMessage | None:
    """The next message for the hybrid; None once its side of the stream ended."""
    getter = asyncio.ensure_future(session.outbox.get())
    done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    return None
