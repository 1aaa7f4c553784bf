"""Core behaviour with fake tools: limits, retries, errors, classification."""

from __future__ import annotations

import asyncio

import pytest

from libra.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    ResourceExhausted,
)
from libra.types import SizeClass, SizeThresholds, ToolStatus
from services.toolgateway.core import (
    ScoreRequest,
    ToolCall,
    ToolGatewayCore,
    ToolGatewayLimits,
    estimate_tokens,
)
from services.toolgateway.errors import UnknownReward, UnknownTool
from services.toolgateway.rewards import RewardOutput, RewardRegistry
from services.toolgateway.tools import ToolOutput, ToolRegistry

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


class FakeTool:
    """A tool whose behaviour the test scripts: outputs in order, or an exception."""

    description = "fake"
    args_schema = SCHEMA
    timeout_s = 5.0

    def __init__(self, name="fake", idempotent=True, script=(), gate=None):
        self.name, self.idempotent = name, idempotent
        self.script, self.gate, self.num_runs = list(script), gate, 0

    async def run(self, args, ctx):
        self.num_runs += 1
        if self.gate is not None:
            await self.gate.wait()
        step = self.script.pop(0) if self.script else ToolOutput(ok=True, output="ok")
        if isinstance(step, Exception):
            raise step
        return step


class FakeReward:
    name, description = "fake_reward", "returns a fixed value"

    def __init__(self, value):
        self.value = value

    async def score(self, request):
        return RewardOutput(self.value, {"k": 1})


async def no_sleep(_s):
    return None


def make_core(*tools, limits=None, rewards=()):
    return ToolGatewayCore(ToolRegistry(tools), RewardRegistry(rewards), limits, sleep=no_sleep)


def call(tool="fake", call_id="c1", deadline_ms=None, **args):
    return ToolCall("t1", call_id, tool, args or {"n": 1}, deadline_ms)


async def test_unknown_tool_lists_known_tools():
    with pytest.raises(UnknownTool, match="'nope'.*known tools: fake") as info:
        await make_core(FakeTool()).execute(call("nope"))
    assert info.value.grpc_status_name == "INVALID_ARGUMENT" and not info.value.retryable


@pytest.mark.parametrize("args, field", [({}, "n"), ({"n": "x"}, "args.n")])
async def test_bad_args_name_the_field(args, field):
    with pytest.raises(InvalidArgument) as info:
        await make_core(FakeTool()).execute(ToolCall("t", "c", "fake", args))
    assert info.value.field == field


async def test_concurrency_limit_and_bounded_queue_raise_resource_exhausted():
    gate = asyncio.Event()
    core = make_core(FakeTool(gate=gate), limits=ToolGatewayLimits(
        max_concurrency_per_tool=2, max_queue_depth_per_tool=3))
    tasks = [asyncio.ensure_future(core.execute(call(call_id=str(i)))) for i in range(5)]
    await asyncio.sleep(0.01)
    with pytest.raises(ResourceExhausted) as info:
        await core.execute(call(call_id="overflow"))
    assert info.value.retry_after_ms > 0 and info.value.retryable
    assert info.value.grpc_status_name == "RESOURCE_EXHAUSTED"
    gate.set()
    assert all(r.status is ToolStatus.SUCCESS for r in await asyncio.gather(*tasks))


async def test_deadline_while_queued_raises_deadline_exceeded():
    gate = asyncio.Event()
    core = make_core(FakeTool(gate=gate), limits=ToolGatewayLimits(max_concurrency_per_tool=1))
    first = asyncio.ensure_future(core.execute(call(call_id="a")))
    await asyncio.sleep(0.01)
    with pytest.raises(DeadlineExceeded):
        await core.execute(call(call_id="b", deadline_ms=50))
    gate.set()
    await first


async def test_idempotent_tool_is_retried_after_a_fault():
    tool = FakeTool(script=[RuntimeError("flaky"), ToolOutput(ok=True, output="7")])
    result = await make_core(tool).execute(call())
    assert result.status is ToolStatus.SUCCESS and result.num_attempts == 2


async def test_non_idempotent_tool_is_not_retried():
    tool = FakeTool(idempotent=False, script=[RuntimeError("boom"), ToolOutput(ok=True)])
    result = await make_core(tool).execute(call())
    assert result.status is ToolStatus.FAILURE and tool.num_runs == 1
    assert result.error == "internal error"


async def test_model_facing_failure_is_not_retried():
    tool = FakeTool(script=[ToolOutput(ok=False, error="busy")])
    result = await make_core(tool).execute(call())
    assert (result.status, result.error, tool.num_runs) == (ToolStatus.FAILURE, "busy", 1)


async def test_tool_ignoring_its_timeout_hits_the_backstop():
    tool = FakeTool(gate=asyncio.Event())
    core = make_core(tool, limits=ToolGatewayLimits(timeout_grace_ms=10))
    result = await core.execute(call(deadline_ms=100))
    assert result.status is ToolStatus.TIMEOUT and result.state.key == "fake:small:timeout"


@pytest.mark.parametrize("chars, size", [(40, SizeClass.SMALL), (400, SizeClass.MEDIUM),
                                         (4000, SizeClass.LARGE)])
async def test_size_class_follows_token_thresholds(chars, size):
    tool = FakeTool(script=[ToolOutput(ok=True, output="a" * chars)])
    limits = ToolGatewayLimits(size_thresholds=SizeThresholds(20, 200))
    result = await make_core(tool, limits=limits).execute(call())
    assert result.payload_tokens == estimate_tokens("a" * chars) and result.size_class is size
    assert result.state.key == f"fake:{size.value}:success"


async def test_output_is_truncated_with_marker():
    tool = FakeTool(script=[ToolOutput(ok=True, output="b" * 100)])
    result = await make_core(tool, limits=ToolGatewayLimits(max_output_chars=10)).execute(call())
    assert result.truncated and result.output.startswith("b" * 10)
    assert result.output.endswith("[truncated 90 chars]")


async def test_injected_token_counter_is_used():
    core = ToolGatewayCore(ToolRegistry([FakeTool()]), RewardRegistry(),
                           token_counter=lambda s: 10_000 * len(s))
    assert (await core.execute(call())).size_class is SizeClass.LARGE


def test_list_tools_reports_specs():
    (spec,) = make_core(FakeTool(idempotent=False)).list_tools()
    assert (spec.name, spec.idempotent, spec.args_schema) == ("fake", False, SCHEMA)


async def test_score_checks_reward_range_and_name():
    core = make_core(FakeTool(), rewards=[FakeReward(0.5)])
    result = await core.score(ScoreRequest("t1", "fake_reward", "x"))
    assert (result.reward, result.details) == (0.5, {"k": 1})
    with pytest.raises(UnknownReward, match="known rewards: fake_reward"):
        await core.score(ScoreRequest("t1", "other", "x"))
    with pytest.raises(Internal):
        await make_core(rewards=[FakeReward(1.5)]).score(ScoreRequest("t", "fake_reward", ""))
