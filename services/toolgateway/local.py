"""The gateway in-process, for ``libra tool run|list|rewards --local``.

The CLI lives in ``libra`` and must not import ``services`` at module import time, so it
imports this module lazily. Results come back as the ``libra.types`` the gRPC client
returns, and the gateway raises ``libra.errors`` classes itself (services/toolgateway/
errors.py), so the CLI handles one shape either way.
"""

from __future__ import annotations

from typing import Any

from libra import types as t
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ToolCall, ToolGatewayCore


def local_config() -> ToolGatewayConfig:
    """The gateway's defaults, minus the calculator's injected "busy" failures.

    The injected failures exist to teach a policy to retry; a person trying a tool from
    the command line wants the tool's real answer.
    """
    return ToolGatewayConfig(calculator_transient_failure_rate=0.0)


def _core(cfg: ToolGatewayConfig | None) -> ToolGatewayCore:
    from services.toolgateway.__main__ import build_core

    return build_core(cfg or local_config())


async def run_tool(tool: str, args: dict[str, Any], *, call_id: str = "local",
                   deadline_ms: int | None = None,
                   cfg: ToolGatewayConfig | None = None) -> t.ToolResult:
    """Execute one tool call in a freshly built in-process core.

    Raises:
        libra.errors.InvalidArgument: Unknown tool (field "tool", the message lists the
            known tools) or arguments that fail the tool's schema.
        libra.errors.LibraError: Any other refusal of the gateway.
    """
    core = _core(cfg)
    return await core.execute(ToolCall("local", call_id, tool, args, deadline_ms))


def list_tools(cfg: ToolGatewayConfig | None = None) -> list[dict[str, Any]]:
    """The tool specs in the shape ``GrpcToolGatewayClient.list_tools`` returns."""
    return [{"name": s.name, "description": s.description, "args_schema": s.args_schema,
             "idempotent": s.idempotent} for s in _core(cfg).list_tools()]


def list_rewards(cfg: ToolGatewayConfig | None = None) -> list[dict[str, str]]:
    """The rewards in the shape ``GrpcToolGatewayClient.list_rewards`` returns."""
    return [{"name": r.name, "description": r.description} for r in _core(cfg).list_rewards()]
