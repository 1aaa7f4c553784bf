"""The tool gateway's own refusals, as subclasses of ``libra.errors``.

A tool that *runs and fails* is not an error here: it is a ``ToolResult`` with status
failure or timeout, because that outcome is part of the causal signal the model learns
from. The gateway raises ``libra.errors`` classes for calls it refuses or cannot finish
(``InvalidArgument`` naming the field, ``DeadlineExceeded``, ``Unavailable``,
``Internal``), so the one interceptor in ``libra.grpcx`` maps them to status codes as it
does for every service, and a caller sees the class the gateway raised. The subclasses
below only carry what a caller may want besides the message (the names the gateway knows,
the retry hint).
"""

from __future__ import annotations

from collections.abc import Iterable

from libra import errors

# The classes plugins were told to raise from here (docs/plugins.md: a reward that cannot
# decide raises Unavailable) stay importable from this module: they are libra's own.
from libra.errors import DeadlineExceeded as DeadlineExceeded
from libra.errors import Internal as Internal
from libra.errors import InvalidArgument as InvalidArgument
from libra.errors import ResourceExhausted as ResourceExhausted
from libra.errors import Unavailable as Unavailable


class UnknownTool(errors.InvalidArgument):
    """The call names a tool that is not registered (field ``tool``; ``known`` lists the
    registered names, sorted)."""

    def __init__(self, tool: str, known: Iterable[str]) -> None:
        self.known = sorted(known)
        super().__init__("tool", f"unknown tool {tool!r}; known tools: {', '.join(self.known)}")
        self.tool = tool


class UnknownReward(errors.InvalidArgument):
    """The score request names a reward that is not registered (field ``reward``)."""

    def __init__(self, reward: str, known: Iterable[str]) -> None:
        self.known = sorted(known)
        super().__init__(
            "reward", f"unknown reward {reward!r}; known rewards: {', '.join(self.known)}"
        )
        self.reward = reward


class ToolBusy(errors.ResourceExhausted):
    """The tool's concurrency slots and wait queue are full.

    The hint goes into the message as "(retry after N ms)" because gRPC carries only the
    details string: ``libra.errors.error_from_status`` reads it back into
    ``retry_after_ms`` on the caller's side.
    """

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(f"{message} (retry after {retry_after_ms} ms)", retry_after_ms)
