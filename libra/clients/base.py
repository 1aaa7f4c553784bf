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
# gRPC's words when no subchannel could connect: the call was failed before sending.
NEVER_SENT_DETAILS = "failed to connect to all addresses"
# Longer than the channels' reconnect backoff cap (libra.grpcx, 2 s, +20% jitter): in it a
# channel whose peer is back up has reconnected.
RECONNECT_WAIT_S = 3.0


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
        """Close the channel; calls still in flight fail with CANCELLED."""
        await self._channel.close()

    async def _call(self, method: Callable[..., Awaitable[R]], request: Any, *,
                    idempotent: bool = False, timeout_s: float | None = None) -> R:
        """Call once, or with backoff on UNAVAILABLE when the RPC is idempotent.

        A call refused before it was sent (the channel is between reconnect attempts,
        e.g. its peer was just restarted) is made once more, idempotent or not, waiting
        for the channel's next attempt (``wait_for_ready``, at most
        ``RECONNECT_WAIT_S``); a peer still down then raises the first error.
        """
        timeout_s = timeout_s or self._timeout_s
        attempts = self._max_attempts if idempotent else 1
        delay_s = 0.05
        attempt, refused, waiting = 0, None, False
        while True:
            attempt += 1
            try:
                if not waiting:
                    return await method(request, timeout=timeout_s)
                return await method(request, timeout=min(timeout_s, RECONNECT_WAIT_S),
                                    wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                if refused is None and _never_sent(exc):
                    refused, waiting, attempt = exc, True, attempt - 1
                    continue
                if waiting and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    # Still unreachable after a reconnect attempt: fail as the peer's
                    # absence, at once (the wait outlasted the retries' backoff).
                    raise error_from_status(refused.code().name,
                                            refused.details() or "") from exc
                waiting = False
                retry = exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < attempts
                if not retry:
                    raise error_from_status(exc.code().name, exc.details() or "") from exc
                logger.debug("retrying address=%s attempt=%d", self.address, attempt)
                await asyncio.sleep(delay_s * (1 + random.random()))
                delay_s *= 2


def _never_sent(exc: grpc.aio.AioRpcError) -> bool:
    """UNAVAILABLE from the channel itself: no connection, so the request never left."""
    return (exc.code() == grpc.StatusCode.UNAVAILABLE
            and (exc.details() or "").startswith(NEVER_SENT_DETAILS))
