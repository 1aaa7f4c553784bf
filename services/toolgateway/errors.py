"""Errors the tool gateway core raises for the servicer to map onto gRPC status codes.

A tool that *runs and fails* is not an error here: it is a ``ToolResult`` with status
failure or timeout, because that outcome is part of the causal signal the model learns
from. These classes are for calls the gateway refuses or cannot finish. Each declares
``grpc_status_name`` (a ``grpc.StatusCode`` member name, kept as a string so the core never
imports grpc) and ``retryable`` (whether the same request may succeed later).
"""

from __future__ import annotations

from collections.abc import Iterable


class ToolGatewayError(Exception):
    """Base class of the gateway's API errors."""

    grpc_status_name: str = "INTERNAL"
    retryable: bool = False


class InvalidArgument(ToolGatewayError):
    """The request is malformed; ``field`` names the offending field."""

    grpc_status_name = "INVALID_ARGUMENT"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownTool(InvalidArgument):
    """The call names a tool that is not registered."""

    def __init__(self, tool: str, known: Iterable[str]) -> None:
        self.known = sorted(known)
        super().__init__("tool", f"unknown tool {tool!r}; known tools: {', '.join(self.known)}")
        self.tool = tool


class UnknownReward(InvalidArgument):
    """The score request names a reward that is not registered."""

    def __init__(self, reward: str, known: Iterable[str]) -> None:
        self.known = sorted(known)
        super().__init__(
            "reward", f"unknown reward {reward!r}; known rewards: {', '.join(self.known)}"
        )
        self.reward = reward


class ResourceExhausted(ToolGatewayError):
    """The tool's concurrency slots and wait queue are full; retry after ``retry_after_ms``."""

    grpc_status_name = "RESOURCE_EXHAUSTED"
    retryable = True

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(f"{message} (retry after {retry_after_ms} ms)")
        self.retry_after_ms = retry_after_ms


class DeadlineExceeded(ToolGatewayError):
    """The caller's deadline passed before the tool could start."""

    grpc_status_name = "DEADLINE_EXCEEDED"
    retryable = True


class Unavailable(ToolGatewayError):
    """A remote dependency (for example an LLM judge) failed; a retry may succeed."""

    grpc_status_name = "UNAVAILABLE"
    retryable = True


class Internal(ToolGatewayError):
    """A plugin broke its contract (for example a reward outside [0, 1])."""

    grpc_status_name = "INTERNAL"
