"""What every typed client shares: deadlines, retries of idempotent calls, error mapping."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from libra.errors import error_from_status
from libra.grpc_auth import ClientAuth
from libra.grpcx import client_channel

logger = logging.getLogger(__name__)
R = TypeVar("R")


class GrpcClientBase:
    """Owns one channel; ``_call`` applies the deadline and maps status codes to errors."""

    def __init__(self, address: str, timeout_s: float = 10.0, max_attempts: int = 3, *,
                 auth: ClientAuth | None = None) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._max_attempts = max_attempts
        # ``auth``: the bearer token sent on every call, and TLS when it names a CA.
        self._channel = client_channel(address, auth)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: Callable[..., Awaitable[R]], request: Any, *,
                    idempotent: bool = False, timeout_s: float | None = None) -> R:
        """Call once, or with backoff on UNAVAILABLE when the RPC is idempotent."""
        attempts = self._max_attempts if idempotent else 1
        delay_s = 0.05
        for attempt in range(1, attempts + 1):
            try:
                return await method(request, timeout=timeout_s or self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                retry = exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < attempts
                if not retry:
                    raise error_from_status(exc.code().name, exc.details() or "") from exc
                logger.debug("retrying address=%s attempt=%d", self.address, attempt)
                await asyncio.sleep(delay_s * (1 + random.random()))
                delay_s *= 2
        raise AssertionError("unreachable")
