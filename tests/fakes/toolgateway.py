"""Fake tool gateway client (``libra.clients.toolgateway.ToolGatewayApi``).

Replaces: the tool gateway service behind gRPC (tool sandboxes and reward functions).
Everything else is real. Results are scripted; the fake can raise ``Unavailable`` a
given number of times (or forever), advance a ``FakeClock`` on each call, and hold a
call open until a test releases it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from libra import types as t
from libra.clock import FakeClock
from libra.errors import Unavailable


def tool_result(output: str = "3", ok: bool = True, tool_type: str = "calculator",
                payload_tokens: int = 1) -> t.ToolResult:
    status = t.ToolStatus.SUCCESS if ok else t.ToolStatus.FAILURE
    return t.ToolResult(status, output if ok else "", "" if ok else output, payload_tokens, 1,
                        t.ToolReturnState(tool_type, t.SizeClass.SMALL, status))


@dataclass
class FakeToolGateway:
    results: deque = field(default_factory=deque)
    reward: float = 1.0
    fail_times: int = 0  # raise Unavailable on this many execute calls (-1: always)
    clock: FakeClock | None = None
    advance_s_per_call: float = 0.0
    gate: asyncio.Event | None = None  # when set, execute waits for it
    calls: list[dict[str, Any]] = field(default_factory=list)
    scores: list[dict[str, Any]] = field(default_factory=list)
    on_execute: Any = None  # optional async callback run inside execute
    components: dict[str, float] = field(default_factory=dict)  # returned with the reward
    score_error: Exception | None = None  # raised by every score call when set

    async def execute(self, trajectory_id: str, call_id: str, tool: str, args: dict[str, Any],
                      deadline_ms: int, options: dict[str, Any] | None = None
                      ) -> t.ToolResult:
        self.calls.append({"trajectory_id": trajectory_id, "call_id": call_id, "tool": tool,
                           "args": args, "deadline_ms": deadline_ms,
                           "options": options or {}})
        if self.clock is not None:
            self.clock.advance(self.advance_s_per_call)
        if self.on_execute is not None:
            await self.on_execute()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_times:
            self.fail_times -= 1 if self.fail_times > 0 else 0
            raise Unavailable("tool gateway down")
        return self.results.popleft() if self.results else tool_result()

    async def score(self, request: t.ScoreInput, timeout_s: float | None = None
                    ) -> t.ScoreOutput:
        self.scores.append({"trajectory_id": request.trajectory_id, "reward": request.reward,
                            "final_text": request.final_text, "reference": request.reference,
                            "request": request, "timeout_s": timeout_s})
        if self.score_error is not None:
            raise self.score_error
        return t.ScoreOutput(self.reward, dict(self.components))
