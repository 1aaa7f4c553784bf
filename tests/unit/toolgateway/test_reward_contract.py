"""The reward contract as the core enforces it (rewards/base.py): a reward that raises,
times out, or returns a non-finite or out-of-range score (or component) is an
``Internal`` error naming the reward; composite and format rewards; the request carries
the whole trajectory.

Real: ``ToolGatewayCore``, its registries and built-in rewards; the misbehaving rewards
are small in-file plugins (the boundary under test is the contract)."""

from __future__ import annotations

import asyncio
import math

import pytest

from libra import types as t
from libra.errors import Internal
from services.toolgateway.core import ScoreRequest, ToolGatewayCore
from services.toolgateway.errors import UnknownReward
from services.toolgateway.rewards import (
    RewardOutput,
    RewardRegistry,
    build_reward_registry,
)
from services.toolgateway.tools import ToolRegistry


class Scripted:
    """Returns ``value`` (or ``components``), or raises ``error``, or never answers."""

    description = "test reward"

    def __init__(self, name: str, value: float = 1.0, error: Exception | None = None,
                 components: dict | None = None, hang: bool = False) -> None:
        self.name, self.value, self.error = name, value, error
        self.components, self.hang = components or {}, hang
        self.requests: list[ScoreRequest] = []

    async def score(self, request: ScoreRequest) -> RewardOutput:
        self.requests.append(request)
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        return RewardOutput(reward=self.value, components=self.components)


def core_with(sandbox, *plugins: Scripted) -> ToolGatewayCore:
    registry = build_reward_registry(sandbox)
    for plugin in plugins:
        registry.register(plugin)
    return ToolGatewayCore(ToolRegistry(), registry)


@pytest.mark.parametrize("value, shown", [(math.nan, "nan"), (math.inf, "inf"),
                                          (1.5, "1.5"), (-0.1, "-0.1")])
async def test_a_non_finite_or_out_of_range_score_is_internal_naming_the_reward(
        sandbox, value, shown) -> None:
    core = core_with(sandbox, Scripted("bad", value))
    with pytest.raises(Internal, match=rf"reward 'bad' returned {shown}, not a finite number"):
        await core.score(ScoreRequest("t", "bad", "x"))


async def test_a_component_out_of_range_is_internal(sandbox) -> None:
    core = core_with(sandbox, Scripted("bad", 1.0, components={"part": math.nan}))
    with pytest.raises(Internal, match="reward 'bad' component 'part' is nan"):
        await core.score(ScoreRequest("t", "bad", "x"))


async def test_a_reward_raising_at_call_is_internal_naming_reward_and_error(sandbox) -> None:
    core = core_with(sandbox, Scripted("boom", error=KeyError("answer")))
    with pytest.raises(Internal, match="reward 'boom' raised KeyError: 'answer'"):
        await core.score(ScoreRequest("t", "boom", "x"))


async def test_a_reward_past_the_jobs_timeout_is_internal(sandbox) -> None:
    core = core_with(sandbox, Scripted("slow", hang=True))
    with pytest.raises(Internal, match="reward 'slow' timed out after 0.05s"):
        await core.score(ScoreRequest("t", "slow", "x", options={"timeout_s": 0.05}))


async def test_composite_is_the_weighted_sum_with_components(sandbox) -> None:
    core = core_with(sandbox, Scripted("half", 0.5))
    out = await core.score(ScoreRequest("t", "composite", "4", "4", options={"components": [
        {"name": "exact_match", "weight": 1.0}, {"name": "half", "weight": 2.0}]}))
    assert out.reward == 2.0 and out.components == {"exact_match": 1.0, "half": 0.5}


async def test_composite_with_an_unknown_component_is_unknown_reward(sandbox) -> None:
    core = core_with(sandbox)
    with pytest.raises(UnknownReward, match="unknown reward 'nope'"):
        await core.score(ScoreRequest("t", "composite", "4", "4", options={
            "components": [{"name": "nope", "weight": 1.0}]}))


async def test_a_failing_component_fails_the_composite_naming_it(sandbox) -> None:
    core = core_with(sandbox, Scripted("bad", math.inf))
    with pytest.raises(Internal, match="reward 'bad' returned inf"):
        await core.score(ScoreRequest("t", "composite", "4", "4", options={
            "components": [{"name": "exact_match"}, {"name": "bad"}]}))


TOOL_TURNS = (t.TranscriptMessage("user", "What is 2+2?"),
              t.TranscriptMessage("assistant", "<calc>2+2</calc>",
                                  (t.TranscriptToolCall("calculator", '{"expression": "2+2"}'),)),
              t.TranscriptMessage("tool", "<res>4</res>", name="calculator",
                                  tool_status="success"),
              t.TranscriptMessage("assistant", "<calc>2+</calc>"),
              t.TranscriptMessage("tool", "<err>bad</err>", name="invalid",
                                  tool_status="failure"),
              t.TranscriptMessage("assistant", "<ans>4</ans>"))


@pytest.mark.parametrize("final_text, messages, want", [
    ("4", TOOL_TURNS, {"final_answer": 1.0, "well_formed_calls": 0.5}),
    ("", TOOL_TURNS[:3], {"final_answer": 0.0, "well_formed_calls": 1.0}),
    ("4", (), {"final_answer": 1.0, "well_formed_calls": 1.0}),
])
async def test_format_reward_reads_the_transcript(sandbox, final_text, messages, want) -> None:
    out = await core_with(sandbox).score(ScoreRequest("t", "format", final_text,
                                                      messages=messages))
    assert out.components == want
    assert out.reward == 0.5 * want["final_answer"] + 0.5 * want["well_formed_calls"]


async def test_a_plugin_reward_sees_the_whole_trajectory(sandbox) -> None:
    spy = Scripted("spy")
    await core_with(sandbox, spy).score(ScoreRequest(
        "t", "spy", "4", "4", messages=TOOL_TURNS, metadata={"source": "gsm8k"}, num_turns=3))
    (request,) = spy.requests
    assert request.messages[1].tool_calls[0].name == "calculator"
    assert (request.metadata, request.num_turns) == ({"source": "gsm8k"}, 3)


async def test_existing_rewards_keep_working_without_the_new_fields() -> None:
    core = ToolGatewayCore(ToolRegistry(), RewardRegistry([Scripted("old", 0.25)]))
    out = await core.score(ScoreRequest("t", "old", "x", "y"))
    assert (out.reward, out.components) == (0.25, {})
