"""``python`` tool: runs ``{"code": "..."}`` in the injected sandbox.

Returns stdout on success; on failure stdout followed by stderr, so the model sees the
traceback. Not idempotent: code may have side effects, so the gateway never reruns it.
"""

from __future__ import annotations

from typing import Any

from libra.types import ToolStatus
from services.toolgateway.sandbox import Sandbox
from services.toolgateway.tools.base import ToolContext, ToolOutput


class PythonTool:
    """Built-in ``python`` tool backed by a ``Sandbox``."""

    name = "python"
    description = "Run a Python 3 program; returns what it prints."
    idempotent = False

    def __init__(self, sandbox: Sandbox, timeout_s: float = 10.0, max_code_chars: int = 20000):
        self._sandbox = sandbox
        self.timeout_s = timeout_s
        self.args_schema = {
            "type": "object",
            "properties": {"code": {"type": "string", "maxLength": max_code_chars}},
            "required": ["code"],
            "additionalProperties": False,
        }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run the code with the call's effective timeout."""
        result = await self._sandbox.run(args["code"], timeout_s=ctx.timeout_s)
        if result.status is ToolStatus.SUCCESS:
            return ToolOutput(ok=True, output=result.stdout)
        return ToolOutput(
            ok=False, output=result.stdout + result.stderr, error=result.error,
            is_timeout=result.status is ToolStatus.TIMEOUT,
        )
