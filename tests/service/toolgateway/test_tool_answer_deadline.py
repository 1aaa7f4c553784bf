"""The client's RPC deadline catches only a gateway that never answers.

A real gateway over gRPC (the real servicer and core, a plugin tool) whose event loop
is loaded: each call starts ``START_LAG_S`` after it arrived, and its answer leaves
``ANSWER_LAG_S`` after the tool returned. The tool finishes just inside the time the
gateway gives it. With the client waiting the budget + 1 s and the gateway counting the
budget from the call's arrival, that answer came after the client's deadline by
construction (sleeps only ever run long), and the call was reported as a timeout. The
budget is now counted from the caller's send on both ends (libra/tool_deadline.py), so
the answer lands with more than a second to spare."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from libra import types as t
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.tool_deadline import ANSWER_MARGIN_S
from services.toolgateway.servicer import ToolGatewayServicer
from services.toolgateway.tools.base import ToolContext, ToolOutput
from tests.service.toolgateway.conftest import Gateway, StartGateway

BUDGET_MS = 2000
START_LAG_S = 1.2  # past the old 1 s margin
ANSWER_LAG_S = 0.3
FINISH_INSIDE_S = 0.05


class PunctualTool:
    """Finishes FINISH_INSIDE_S inside the time the gateway gives it; says how long that
    was."""

    name = "punctual"
    description = "Returns just before its time limit."
    args_schema: dict[str, Any] = {"type": "object"}
    idempotent = False
    timeout_s = 60.0

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        await asyncio.sleep(max(ctx.timeout_s - FINISH_INSIDE_S, 0.0))
        return ToolOutput(ok=True, output=f"{ctx.timeout_s:.3f}")


class LoadedServicer(ToolGatewayServicer):
    """The real servicer on a busy event loop: late to start, late to answer."""

    def __init__(self, *args: Any, start_lag_s: float) -> None:
        super().__init__(*args)
        self._start_lag_s = start_lag_s

    async def ExecuteToolCall(self, request, context):  # noqa: N802, ANN001
        await asyncio.sleep(self._start_lag_s)
        response = await super().ExecuteToolCall(request, context)
        await asyncio.sleep(ANSWER_LAG_S)
        return response


def started(start_gateway: StartGateway, start_lag_s: float) -> Awaitable[Gateway]:
    return start_gateway(lambda core: LoadedServicer(core, start_lag_s=start_lag_s),
                         extra_tools=[f"{__name__}:PunctualTool"])


@pytest.fixture
async def loaded(start_gateway: StartGateway) -> GrpcToolGatewayClient:
    return (await started(start_gateway, START_LAG_S)).client


@pytest.fixture
async def prompt(start_gateway: StartGateway) -> GrpcToolGatewayClient:
    return (await started(start_gateway, 0.0)).client


async def test_a_tool_finishing_inside_its_time_on_a_late_gateway_is_not_a_timeout(
        loaded: GrpcToolGatewayClient) -> None:
    """Before: DeadlineExceeded (the rollout's ``timeout`` return) for a tool that
    finished in time: 1.2 s late start + 1.75 s run + 0.3 s answer > 2 s + 1 s."""
    result = await loaded.execute("traj", "c1", "punctual", {}, BUDGET_MS)
    assert result.status is t.ToolStatus.SUCCESS
    given_s = float(result.output)
    # What was left of the caller's budget when the call started, not the whole budget.
    assert given_s <= BUDGET_MS / 1000 + ANSWER_MARGIN_S - START_LAG_S


async def test_a_prompt_gateway_gives_the_tool_the_whole_budget(
        prompt: GrpcToolGatewayClient) -> None:
    """The cap binds only on a late start: a call that starts at once runs for its
    budget (less the local RPC's own transit, far below the margin)."""
    result = await prompt.execute("traj", "c1", "punctual", {}, BUDGET_MS)
    assert result.status is t.ToolStatus.SUCCESS
    assert float(result.output) == pytest.approx(BUDGET_MS / 1000, abs=ANSWER_MARGIN_S / 2)
