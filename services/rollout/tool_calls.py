"""The tool calls of one turn, run through the tool gateway (pure: the gateway client
and the clock come in as collaborators).

The calls of a turn run concurrently. A call that cannot run comes back as a tool error
the model reads (and a ``failure`` in the causal signal), never as a failed trajectory:
a name the job does not enable, a malformed call the parser reported, arguments the
tool's schema refuses. A gateway that answers too late (the call's RPC deadline passed:
the gateway answers within it by design, libra/tool_deadline.py, so it is stuck or
overloaded past its margin) is a ``timeout`` return, as the gateway would have answered.
Only the gateway being unreachable past the deadline fails the trajectory (the caller's
``LibraError``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from libra import tracing
from libra import types as t
from libra.chat.toolcalls import ToolCall
from libra.clock import Clock
from libra.errors import DeadlineExceeded, InvalidArgument, LibraError, NotFound
from libra.jobspec import JobSpec
from services.rollout import agent

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc at run time
    from libra.clients.api import ToolGatewayApi


class ToolCaller:
    """Runs a turn's calls with retries under one deadline per call."""

    def __init__(self, tools: ToolGatewayApi, clock: Clock, deadline_s: float) -> None:
        self._tools = tools
        self._clock = clock
        self._deadline_s = deadline_s

    async def run_turn(self, spec: JobSpec, traj: t.Trajectory,
                       outcome: agent.TurnOutcome) -> list[agent.ToolTurnResult]:
        """Every call's result in turn order, then one error result per malformed call."""
        ran = await asyncio.gather(*(self._run_call(spec, traj, index, call)
                                     for index, call in enumerate(outcome.calls)))
        refused = [agent.ToolTurnResult(agent.INVALID_TOOL_TYPE, agent.invalid_call_result(e))
                   for e in outcome.errors]
        return [*ran, *refused]

    async def _run_call(self, spec: JobSpec, traj: t.Trajectory, index: int,
                        call: ToolCall) -> agent.ToolTurnResult:
        enabled = spec.tools.enabled
        if call.name not in enabled:
            return agent.ToolTurnResult(call.name, agent.invalid_call_result(
                f"unknown tool {call.name!r} (available: {', '.join(enabled)})"))
        # The first call of a turn keeps the id it always had (the calculator's injected
        # failures are a function of the call id).
        call_id = f"{traj.trajectory_id}:t{traj.num_turns}" + (f".{index}" if index else "")
        started_ms, retries = self._clock.now_ms(), [0]
        try:
            result = await self._execute(spec, traj, call_id, call.name, call.arguments,
                                         retries)
        except (InvalidArgument, NotFound) as exc:
            return agent.ToolTurnResult(call.name, agent.invalid_call_result(
                f"bad call of {call.name}: {exc}", tool_type=call.name))
        except LibraError as exc:
            tracing.record_child("tool.call", traj.traceparent, started_ms,
                                 self._clock.now_ms(), error=str(exc), **{
                                     "libra.tool": call.name, "libra.call_id": call_id,
                                     "libra.retries": retries[0]})
            raise
        if tracing.is_recording(traj.traceparent):
            tracing.record_child("tool.call", traj.traceparent, started_ms,
                                 self._clock.now_ms(),
                                 **_call_attributes(call_id, result, retries[0]))
        return agent.ToolTurnResult(call.name, result)

    async def _execute(self, spec: JobSpec, traj: t.Trajectory, call_id: str, tool: str,
                       args: dict[str, Any], retries: list[int]) -> t.ToolResult:
        """Call the tool, retrying retryable errors (gateway down) until the deadline;
        ``retries[0]`` counts the retries."""
        budget_s = min(self._deadline_s, spec.tools.call_timeout_s)
        deadline_s = self._clock.now_s() + budget_s
        delay_s = 0.1
        while True:
            remaining_ms = int((deadline_s - self._clock.now_s()) * 1000)
            try:
                return await self._tools.execute(
                    traj.trajectory_id, call_id, tool, args, max(remaining_ms, 1),
                    spec.tools.options_for(tool))
            except DeadlineExceeded:
                # The RPC's deadline is the call's remaining budget plus the time the
                # gateway may take to answer (libra/tool_deadline.py), so the budget is
                # spent: the tool timed out, and the gateway did not say so in time.
                return timed_out_result(call_id, tool, budget_s)
            except LibraError as exc:
                if not exc.retryable or self._clock.now_s() + delay_s >= deadline_s:
                    raise
            await asyncio.sleep(delay_s)
            retries[0] += 1
            delay_s = min(delay_s * 2, 1.0)


def timed_out_result(call_id: str, tool: str, budget_s: float) -> t.ToolResult:
    """The ``timeout`` return of a call whose answer did not come within its budget."""
    return t.ToolResult(t.ToolStatus.TIMEOUT, "", "timeout", 0, int(budget_s * 1000),
                        t.ToolReturnState(tool, t.SizeClass.SMALL, t.ToolStatus.TIMEOUT),
                        call_id=call_id, tool=tool)


def _call_attributes(call_id: str, result: t.ToolResult,
                     retries: int) -> dict[str, str | int]:
    """A tool call span's attributes: the causal signal and its cost."""
    return {"libra.tool": result.state.tool_type, "libra.call_id": call_id,
            "libra.status": result.status.value, "libra.size_class": result.size_class.value,
            "libra.payload_tokens": result.payload_tokens,
            "libra.latency_ms": result.latency_ms, "libra.retries": retries}
