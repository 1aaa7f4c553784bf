"""The tool plugin contract.

A tool is any object with the attributes below and an ``async run(args, ctx)``. The core
validates ``args`` against ``args_schema`` (JSON Schema) before ``run`` is called, enforces
``timeout_s`` (capped by the caller's deadline) and retries only ``idempotent`` tools.
``run`` reports what happened as a ``ToolOutput``; it raises only for infrastructure
faults (those are retried for idempotent tools and otherwise become a failure).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Per-call facts a tool may use."""

    trajectory_id: str
    call_id: str
    timeout_s: float
    """Effective budget: min(tool timeout, caller deadline)."""
    attempt: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    """Job-level settings of this tool from the job spec (each tool documents its keys)."""


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What one tool run produced (model-facing text, not an exception)."""

    ok: bool
    output: str = ""
    error: str = ""
    """Short lowercase reason when not ok; the model reads it."""
    is_timeout: bool = False
    """The tool hit its own time limit (maps to status timeout)."""
    is_transient: bool = False
    """An infrastructure hiccup the gateway may retry (idempotent tools only)."""


@runtime_checkable
class Tool(Protocol):
    """A tool the gateway can execute."""

    name: str
    description: str
    args_schema: dict[str, Any]
    idempotent: bool
    timeout_s: float

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Execute once with validated ``args``."""
        ...
