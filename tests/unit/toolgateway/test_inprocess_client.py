"""``InProcessToolGatewayClient`` over a real gateway core (built-in tools and rewards,
the real sandbox from conftest.py): the ``libra.types`` answers and the ``libra.errors``
failures the gRPC client gives. The fakes are a reward that never answers and a tool that holds its
slot until told, so the deadline and the full-lane tests do not depend on timing."""

from __future__ import annotations

import asyncio

import pytest

from libra import types as t
from libra.errors import DeadlineExceeded, Internal, InvalidArgument, ResourceExhausted
from services.toolgateway.core import ToolGatewayCore, ToolGatewayLimits
from services.toolgateway.inprocess import InProcessToolGatewayClient
from services.toolgateway.rewards import RewardOutput, RewardRegistry
from services.toolgateway.tools import ToolOutput, ToolRegistry


class StuckReward:
    """A reward that answers only when its gate opens (never, unless a test opens it)."""

    name, description = "stuck", "waits for its gate"

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def score(self, request: object) -> RewardOutput:
        await self.gate.wait()
        return RewardOutput(1.0, {})


@pytest.fixture
def client(core: ToolGatewayCore) -> InProcessToolGatewayClient:
    return InProcessToolGatewayClient(core)


async def test_a_tool_call_answers_a_libra_tool_result(client: InProcessToolGatewayClient
                                                       ) -> None:
    result = await client.execute("traj-1", "traj-1:t0", "calculator",
                                  {"expression": "6*7"}, deadline_ms=5000)
    assert isinstance(result, t.ToolResult)
    assert (result.status, result.output.strip()) == (t.ToolStatus.SUCCESS, "42")
    assert isinstance(result.state, t.ToolReturnState)


async def test_an_unknown_tool_is_invalid_argument_naming_tool(
        client: InProcessToolGatewayClient) -> None:
    with pytest.raises(InvalidArgument) as err:
        await client.execute("traj-1", "c", "nope", {}, deadline_ms=1000)
    assert err.value.field == "tool" and "known tools" in err.value.reason


async def test_arguments_the_schema_refuses_are_invalid_argument(
        client: InProcessToolGatewayClient) -> None:
    with pytest.raises(InvalidArgument) as err:
        await client.execute("traj-1", "c", "calculator", {"expression": 7}, deadline_ms=1000)
    assert "expression" in str(err.value)


class GatedTool:
    """A tool that holds its slot until its gate opens; ``started`` says it holds it."""

    name, description, idempotent, timeout_s = "gated", "waits for its gate", True, 5.0
    args_schema: dict = {"type": "object"}

    def __init__(self) -> None:
        self.started, self.gate = asyncio.Event(), asyncio.Event()

    async def run(self, args: dict, ctx: object) -> ToolOutput:
        self.started.set()
        await self.gate.wait()
        return ToolOutput(ok=True, output="done")


async def test_a_full_tool_lane_is_resource_exhausted_with_its_hint() -> None:
    tool = GatedTool()
    limits = ToolGatewayLimits(max_concurrency_per_tool=1, max_queue_depth_per_tool=0)
    client = InProcessToolGatewayClient(ToolGatewayCore(ToolRegistry([tool]),
                                                        RewardRegistry([]), limits))
    first = asyncio.ensure_future(client.execute("traj-1", "a", "gated", {}, 5000))
    await tool.started.wait()  # the only slot is taken: the next call finds no room
    with pytest.raises(ResourceExhausted) as err:
        await client.execute("traj-1", "b", "gated", {}, 5000)
    tool.gate.set()
    assert (await first).output == "done"
    assert err.value.retryable and err.value.retry_after_ms > 0


async def test_score_answers_a_score_output(client: InProcessToolGatewayClient) -> None:
    out = await client.score(t.ScoreInput("traj-1", "exact_match", "42", reference="42"),
                             timeout_s=10.0)
    assert out == t.ScoreOutput(1.0, out.components)


async def test_an_unknown_reward_is_invalid_argument_naming_reward(
        client: InProcessToolGatewayClient) -> None:
    with pytest.raises(InvalidArgument) as err:
        await client.score(t.ScoreInput("traj-1", "no_such_reward", "x"), timeout_s=10.0)
    assert err.value.field == "reward"


async def test_bad_options_json_is_invalid_argument_naming_the_field(
        client: InProcessToolGatewayClient) -> None:
    with pytest.raises(InvalidArgument) as err:
        await client.score(t.ScoreInput("traj-1", "exact_match", "x", options_json="[1]"),
                           timeout_s=10.0)
    assert err.value.field == "options_json"


async def test_a_score_past_its_deadline_is_deadline_exceeded() -> None:
    stuck = StuckReward()
    client = InProcessToolGatewayClient(ToolGatewayCore(ToolRegistry([]),
                                                        RewardRegistry([stuck])))
    with pytest.raises(DeadlineExceeded):
        await client.score(t.ScoreInput("traj-1", "stuck", "x"), timeout_s=0.05)


async def test_a_reward_out_of_range_is_internal() -> None:
    class TooHigh(StuckReward):
        name = "too_high"

        async def score(self, request: object) -> RewardOutput:
            return RewardOutput(1.5, {})

    client = InProcessToolGatewayClient(ToolGatewayCore(ToolRegistry([]),
                                                        RewardRegistry([TooHigh()])))
    with pytest.raises(Internal):
        await client.score(t.ScoreInput("traj-1", "too_high", "x"), timeout_s=10.0)


async def test_the_catalog_lists_the_registries(client: InProcessToolGatewayClient,
                                                core: ToolGatewayCore) -> None:
    tools = await client.list_tools()
    assert [tool["name"] for tool in tools] == [spec.name for spec in core.list_tools()]
    assert set(tools[0]) == {"name", "description", "args_schema", "idempotent"}
    rewards = await client.list_rewards()
    assert "exact_match" in [reward["name"] for reward in rewards]
