"""The trainer's side of a lend, for the rollout core's lend tests: a scripted gradient
stream, its opener, and a fake hybrid trainer (the torch side)."""

from __future__ import annotations

import asyncio

from libra.training import channel as ch


class ScriptedStream:
    """The trainer's end of the gradient channel, driven by the test."""

    def __init__(self) -> None:
        self.sent: list[ch.HybridMessage] = []
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.closed = False

    async def send(self, msg: ch.HybridMessage) -> None:
        self.sent.append(msg)

    async def recv(self) -> ch.CoreMessage | None:
        return await self.incoming.get()

    async def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self) -> None:
        self.streams: list[ScriptedStream] = []
        self.addresses: list[str] = []

    async def open(self, address: str, hello: ch.Hello) -> ScriptedStream:
        stream = ScriptedStream()
        await stream.send(hello)
        self.streams.append(stream)
        self.addresses.append(address)
        return stream


class FakeHybridTrainer:
    lockstep_check_interval = 1

    def __init__(self, snapshot: ch.Snapshot) -> None:
        self.snapshot = snapshot
        self.updates: list[int] = []

    def apply_update(self, data: bytes, lr: float) -> float:
        self.updates.append(len(data))
        return 1.0

    def slice_gradient(self, samples, scale):  # noqa: ANN001, ANN201
        return b"grad", {"loss": 0.5, "num_tokens": 3.0}, True

    def checksum(self) -> str:
        return f"sum-{len(self.updates)}"
