"""Calculator: safe evaluation, error words, deterministic transient failures."""

from __future__ import annotations

import pytest

from libra.types import ToolStatus
from services.toolgateway.core import ToolCall, ToolGatewayCore
from services.toolgateway.rewards import RewardRegistry
from services.toolgateway.tools import CalculatorConfig, CalculatorTool, ToolContext, ToolRegistry


def ctx(call_id="c"):
    return ToolContext("t", call_id, 1.0)


@pytest.mark.parametrize("expr, out", [
    ("1+2*3", "7"), ("(1+2)*3", "9"), ("7/2", "3.5"), ("8/2", "4"), ("7//2", "3"),
    ("7%3", "1"), ("2**10", "1024"), ("-3+1", "-2"), ("0.1+0.2", "0.30000000000000004"),
])
async def test_evaluates(expr, out):
    result = await CalculatorTool().run({"expression": expr}, ctx())
    assert result.ok and result.output == out


@pytest.mark.parametrize("expr, error", [
    ("1+", "syntax"), ("1/0", "divide by zero"), ("5%0", "divide by zero"),
    ("9**9**9", "too large"), ("10**20", "too large"), ("__import__('os')", "not allowed"),
    ("x+1", "not allowed"), ("abs(-1)", "not allowed"), ("(-8)**0.5", "not allowed"),
    ("1" * 300, "too long"), ("'a'*3", "not allowed"),
])
async def test_errors_are_short_words(expr, error):
    result = await CalculatorTool().run({"expression": expr}, ctx())
    assert not result.ok and result.error == error


async def test_transient_failures_are_deterministic_by_call_id():
    tool = CalculatorTool(CalculatorConfig(transient_failure_rate=0.5, seed=7))
    outcomes = [(await tool.run({"expression": "1+1"}, ctx(f"c{i}"))).error for i in range(200)]
    again = [(await tool.run({"expression": "1+1"}, ctx(f"c{i}"))).error for i in range(200)]
    assert outcomes == again and 60 < outcomes.count("busy") < 140
    assert set(outcomes) == {"busy", ""}


async def test_busy_reaches_the_model_without_gateway_retry():
    tool = CalculatorTool(CalculatorConfig(transient_failure_rate=1.0))
    core = ToolGatewayCore(ToolRegistry([tool]), RewardRegistry())
    result = await core.execute(ToolCall("t", "c", "calculator", {"expression": "1"}))
    assert (result.status, result.error, result.num_attempts) == (ToolStatus.FAILURE, "busy", 1)
    assert result.state.key == "calculator:small:failure"


def test_rate_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match="transient_failure_rate"):
        CalculatorConfig(transient_failure_rate=1.5)


async def test_job_level_failure_rate_overrides_the_gateway_setting():
    from services.toolgateway.tools.base import ToolContext
    from services.toolgateway.tools.calculator import CalculatorConfig, CalculatorTool

    tool = CalculatorTool(CalculatorConfig(transient_failure_rate=0.0))
    always = ToolContext("t", "c1", 1.0, options={"transient_failure_rate": 1.0})
    never = ToolContext("t", "c1", 1.0, options={"transient_failure_rate": 0.0})
    assert (await tool.run({"expression": "1+1"}, always)).error == "busy"
    assert (await tool.run({"expression": "1+1"}, never)).output == "2"
