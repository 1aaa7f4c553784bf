"""Hybrid side of the trainer's gradient channel: one bidirectional gRPC stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from libra.errors import error_from_status
from libra.grpc_auth import ClientAuth
from libra.grpcx import client_channel
from libra.proto.trainer.v1 import trainer_pb2 as pb
from libra.proto.trainer.v1 import trainer_pb2_grpc as pb_grpc
from libra.training import channel as ch
from libra.wire.gradient import CoreAssembler, hybrid_to_pb

_END = object()


class GradientStream:
    """An open stream: ``send`` domain messages, ``recv`` whole ones (None at the end)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._call = pb_grpc.GradientChannelStub(channel).Exchange(self._requests())
        self._assembler = CoreAssembler()

    async def _requests(self) -> AsyncIterator[pb.HybridMessage]:
        while (piece := await self._outgoing.get()) is not _END:
            yield piece

    async def send(self, msg: ch.HybridMessage) -> None:
        """Queue ``msg`` for the core, cut into pieces that fit a gRPC message."""
        for piece in hybrid_to_pb(msg):
            self._outgoing.put_nowait(piece)

    async def recv(self) -> ch.CoreMessage | None:
        """The next whole message from the core; None when the core ended the stream."""
        while True:
            try:
                piece = await self._call.read()
            except grpc.aio.AioRpcError as exc:
                raise error_from_status(exc.code().name, exc.details() or "") from exc
            if piece is grpc.aio.EOF:
                return None
            msg = self._assembler.feed(piece)
            if msg is not None:
                return msg

    async def close(self) -> None:
        """End the stream from this side and close the channel."""
        self._outgoing.put_nowait(_END)
        self._call.cancel()
        await self._channel.close()


class GrpcGradientChannel:
    """Opens gradient streams to a trainer (a fresh channel per lend)."""

    def __init__(self, auth: ClientAuth | None = None) -> None:
        self._auth = auth

    async def open(self, address: str, hello: ch.Hello) -> GradientStream:
        """Open a stream to the trainer at ``address`` and introduce this hybrid with ``hello``."""
        stream = GradientStream(client_channel(address, self._auth))
        await stream.send(hello)
        return stream
