"""The tool gateway's client surface without sockets, for a one-process loop.

:class:`InProcessToolGatewayClient` has the methods of
:class:`libra.clients.toolgateway.GrpcToolGatewayClient` (``ToolGatewayApi`` for the
rollout, ``ToolCatalog`` for the coordinator's submit checks) and calls a
:class:`services.toolgateway.core.ToolGatewayCore` in this event loop. It does what the
servicer does between the wire and the core (the score request's JSON fields are checked
by the servicer's own ``score_request``), answers with ``libra.types`` values, and raises
what the gRPC client would raise: the core's error rebuilt from its status
(``error_from_status``, so a gateway ``UnknownTool`` arrives as ``InvalidArgument``
naming ``tool``), anything else as ``Internal``; a ``score`` that overruns ``timeout_s``
raises ``DeadlineExceeded``, as the RPC deadline would. Tools still run where the core
runs them (the sandbox's subprocesses for ``python``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from libra import types as t
from libra.errors import DeadlineExceeded, error_from_status
from services.toolgateway.core import ToolCall, ToolGatewayCore
from services.toolgateway.servicer import score_request

R = TypeVar("R")


class InProcessToolGatewayClient:
    """The tool gateway client over a core in this process (see the module docstring)."""

    def __init__(self, core: ToolGatewayCore) -> None:
        self._core = core

    async def execute(self, trajectory_id: str, call_id: str, tool: str, args: dict[str, Any],
                      deadline_ms: int, options: dict[str, Any] | None = None
                      ) -> t.ToolResult:
        """Run one tool call; ``deadline_ms`` bounds it (0: none, as on the wire)."""
        return await _as_over_grpc(self._core.execute(ToolCall(
            trajectory_id, call_id, tool, dict(args), deadline_ms or None,
            dict(options or {}))))

    async def score(self, request: t.ScoreInput, timeout_s: float | None = None
                    ) -> t.ScoreOutput:
        """Score a finished trajectory within ``timeout_s`` (the RPC's deadline)."""
        try:
            async with asyncio.timeout(timeout_s):
                result = await _as_over_grpc(self._core.score(score_request(request)))
        except TimeoutError as exc:
            raise DeadlineExceeded(f"in-process Score exceeded {timeout_s} s") from exc
        return t.ScoreOutput(result.reward, dict(result.components))

    async def list_tools(self) -> list[dict[str, Any]]:
        """The registered tools, in the shape the gRPC client returns."""
        return [{"name": s.name, "description": s.description,
                 "args_schema": dict(s.args_schema), "idempotent": s.idempotent}
                for s in self._core.list_tools()]

    async def list_rewards(self) -> list[dict[str, str]]:
        """The registered rewards, in the shape the gRPC client returns."""
        return [{"name": r.name, "description": r.description}
                for r in self._core.list_rewards()]

    async def close(self) -> None:
        """Nothing to close (the gRPC client closes its channel here)."""


async def _as_over_grpc(call: Awaitable[R]) -> R:
    """``call``'s result; a failure rebuilt as the gRPC client rebuilds the status the
    server's interceptor answers (a declared status as it is, anything else INTERNAL)."""
    try:
        return await call
    except Exception as exc:
        status = getattr(exc, "grpc_status_name", None) or "INTERNAL"
        raise error_from_status(status, str(exc)) from exc
