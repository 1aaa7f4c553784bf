"""The rollout instance's client surface without sockets, for a one-process loop.

:class:`InProcessRolloutClient` implements :class:`libra.clients.api.RolloutApi`
(the same methods as :class:`libra.clients.rollout.GrpcRolloutClient`) by calling a
:class:`services.rollout.core.RolloutCore` in the same event loop. What crosses the call
is what crosses the wire: the lease goes through its wire codec (the caller gets its own
copy, with only the fields the proto carries), and an error comes back as the gRPC client
would rebuild it (``error_from_status`` on the status a server would answer: a domain
error by its own status, anything else as ``Internal``); a call that overruns its
timeout raises ``DeadlineExceeded``, and the core's work on it is cancelled, as a gRPC
deadline cancels the handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from libra import types as t
from libra.clients.api import InstanceStatus, LendResult
from libra.errors import DeadlineExceeded, error_from_status
from libra.wire.common import lease_from_proto, lease_to_proto
from services.rollout.core import RolloutCore

R = TypeVar("R")


class InProcessRolloutClient:
    """One rollout instance, called in-process (see the module docstring)."""

    def __init__(self, core: RolloutCore, timeout_s: float = 10.0) -> None:
        self._core = core
        self._timeout_s = timeout_s

    async def close(self) -> None:
        """Nothing to close (the gRPC client closes its channel here)."""

    async def lend(self, job_id: str, expected_epoch: int, generation: int,
                   trainer_address: str, *, timeout_s: float | None = None) -> LendResult:
        """Start lending the instance (returns once it is hybrid-joining)."""
        lease, handed = await self._call(self._core.lend(
            job_id, expected_epoch, generation, trainer_address), timeout_s)
        return LendResult(_copied(lease), handed)

    async def reclaim(self, generation: int, reason: str, *,
                      timeout_s: float | None = None) -> t.Lease:
        """Cancel a pending join or detach an active one."""
        return _copied(await self._call(self._core.reclaim(generation, reason), timeout_s))

    async def get_instance_status(self) -> InstanceStatus:
        """What the instance is doing now, as the gRPC client returns it."""
        return self._core.instance_status()

    async def _call(self, call: Awaitable[R], timeout_s: float | None) -> R:
        limit_s = timeout_s or self._timeout_s
        deadline = asyncio.timeout(limit_s)
        try:
            async with deadline:
                return await call
        except TimeoutError as exc:
            if deadline.expired():
                raise DeadlineExceeded(f"in-process call exceeded {limit_s} s") from exc
            raise error_from_status("INTERNAL", str(exc)) from exc
        except Exception as exc:
            # As the server's interceptor answers (a domain error by the status it
            # declares, anything else INTERNAL) and the gRPC client rebuilds it.
            status = getattr(exc, "grpc_status_name", None) or "INTERNAL"
            raise error_from_status(status, str(exc)) from exc


def _copied(lease: t.Lease) -> t.Lease:
    """The lease as a gRPC caller receives it (through the wire codec)."""
    return lease_from_proto(lease_to_proto(lease))
