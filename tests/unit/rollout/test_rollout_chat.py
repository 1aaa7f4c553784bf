"""RolloutCore with a chat model's protocol: Hermes tool calls over a real chat template
(the tiny Qwen2 fixture's tokenizer), several calls per turn, calls that never reach a
tool, and the job's bucket batch size (the rig: rig.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.errors import InvalidArgument
from libra.jobspec import (
    JobSpec,
    LayoutSpec,
    ModelSpec,
    TaskSpec,
    ToolSchema,
    ToolsSpec,
)
from libra.models.hf import load_tokenizer
from libra.types import Bucket
from services.rollout.backend import HfTokenizer
from tests.fakes.toolgateway import tool_result
from tests.unit.rollout.rig import Rig, make_task, started_rig

CALC = ToolSchema(name="calculator", description="Evaluate arithmetic.",
                  parameters_json=json.dumps({
                      "type": "object", "properties": {"expression": {"type": "string"}},
                      "required": ["expression"]}))
SEARCH = ToolSchema(name="search", description="Search the corpus.",
                    parameters_json=json.dumps({"type": "object", "properties": {
                        "query": {"type": "string"}}}))


def call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def chat_spec(batch: int = 8) -> JobSpec:
    return JobSpec(
        model=ModelSpec(kind="hf", path="/unused"),
        task=TaskSpec(name="calc-words", max_turns=4, max_new_tokens_per_turn=64,
                      tool_call_format="hermes"),
        tools=ToolsSpec(enabled=["calculator", "search"], schemas=[CALC, SEARCH]),
        layout=LayoutSpec(buckets=[Bucket(name="short", max_tokens=96,
                                              max_batch_size=batch)]))


@pytest.fixture
def chat_tokenizer(hf_model_dir) -> HfTokenizer:
    tok = load_tokenizer(str(hf_model_dir("qwen2")))
    return HfTokenizer(tok, [tok.eos_token_id], 4096)


@pytest.fixture
async def chat_rig(tmp_path: Path, chat_tokenizer) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, spec=chat_spec(),
                           tokenizer=chat_tokenizer) as rig:
        yield rig


def context_text(rig: Rig, traj: t.Trajectory) -> str:
    return rig.engine.tokenizer.decode(traj.token_ids[traj.num_prompt_tokens:])


async def test_a_tool_call_runs_and_its_output_enters_as_a_tool_message(chat_rig: Rig) -> None:
    chat_rig.engine.queue(call("calculator", expression="12*7") + "<|im_end|>",
                          "The answer is 84.<|im_end|>")
    chat_rig.tools.results.append(tool_result("84"))
    await chat_rig.place(make_task())
    (traj,) = await chat_rig.run_until_published()
    assert [(c["tool"], c["args"]) for c in chat_rig.tools.calls] == [
        ("calculator", {"expression": "12*7"})]
    assert (traj.status, traj.final_text, traj.num_turns) == (
        t.TrajectoryStatus.FINISHED, "The answer is 84.", 2)
    assert "<tool_response>\n84\n</tool_response>" in context_text(chat_rig, traj)
    assert traj.check_aligned() is None
    # Tool tokens are context (mask 0); both sampled turns are trained (mask 1).
    sampled = [i for i, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert chat_rig.engine.tokenizer.decode(sampled).endswith("The answer is 84.<|im_end|>")


async def test_the_first_prompt_renders_the_jobs_tools(chat_rig: Rig) -> None:
    chat_rig.engine.queue("3<|im_end|>")
    await chat_rig.place(make_task(prompt="What is 1+2?"))
    await chat_rig.run_until_published()
    prompt = chat_rig.engine.tokenizer.decode(chat_rig.engine.requests[0].prompt_token_ids)
    assert '"name": "calculator"' in prompt and '"name": "search"' in prompt
    assert prompt.endswith("What is 1+2?<|im_end|>\n<|im_start|>assistant\n")


async def test_two_calls_in_one_turn_both_run_and_both_returns_are_reported(
        chat_rig: Rig) -> None:
    chat_rig.engine.queue(call("calculator", expression="1+2") + "\n"
                          + call("search", query="eggs") + "<|im_end|>", "3<|im_end|>")
    chat_rig.tools.results.extend([tool_result("3"), tool_result("eggs: 12",
                                                                  tool_type="search")])
    await chat_rig.place(make_task())
    (traj,) = await chat_rig.run_until_published()
    assert sorted(c["call_id"] for c in chat_rig.tools.calls) == ["tr-0:t1", "tr-0:t1.1"]
    assert [s.tool_type for s in traj.tool_states] == ["calculator", "search"]
    assert [r["state"].tool_type for r in chat_rig.scheduler.tool_returns] == [
        "calculator", "search"]
    assert context_text(chat_rig, traj).count("<tool_response>") == 2


async def test_an_unknown_tool_becomes_a_tool_error_and_the_trajectory_goes_on(
        chat_rig: Rig) -> None:
    chat_rig.engine.queue(call("weather", city="Oslo") + "<|im_end|>", "3<|im_end|>")
    await chat_rig.place(make_task())
    (traj,) = await chat_rig.run_until_published()
    assert chat_rig.tools.calls == []
    assert "error: unknown tool 'weather' (available: calculator, search)" in context_text(
        chat_rig, traj)
    assert traj.tool_states == [t.ToolReturnState("invalid", t.SizeClass.SMALL,
                                                  t.ToolStatus.FAILURE)]
    assert traj.status is t.TrajectoryStatus.FINISHED


async def test_bad_json_becomes_a_tool_error_with_a_failure_signal(chat_rig: Rig) -> None:
    chat_rig.engine.queue('<tool_call>\n{"name": "calculator", "arguments": {1+2}\n'
                          "</tool_call><|im_end|>", "3<|im_end|>")
    await chat_rig.place(make_task())
    (traj,) = await chat_rig.run_until_published()
    assert chat_rig.tools.calls == []
    assert "error: " in context_text(chat_rig, traj)
    assert traj.tool_states[0].status is t.ToolStatus.FAILURE
    assert traj.status is t.TrajectoryStatus.FINISHED


async def test_arguments_the_gateway_refuses_become_a_tool_error(chat_rig: Rig) -> None:
    async def refuse() -> None:
        raise InvalidArgument("expression", "required")

    chat_rig.tools.on_execute = refuse
    chat_rig.engine.queue(call("calculator", expr="1+2") + "<|im_end|>", "3<|im_end|>")
    await chat_rig.place(make_task())
    (traj,) = await chat_rig.run_until_published()
    assert "error: bad call of calculator: expression: required" in context_text(chat_rig, traj)
    assert traj.tool_states == [t.ToolReturnState("calculator", t.SizeClass.SMALL,
                                                  t.ToolStatus.FAILURE)]
    assert traj.status is t.TrajectoryStatus.FINISHED


async def test_the_buckets_max_batch_size_binds_the_engine_batch(
        tmp_path: Path, chat_tokenizer) -> None:
    async with started_rig(tmp_path, spec=chat_spec(batch=2),
                           tokenizer=chat_tokenizer) as rig:
        rig.engine.queue(*["3<|im_end|>"] * 5)
        for index in range(5):
            await rig.place(make_task(index))
        await rig.run_until_published(5)
        assert max(rig.engine.batch_sizes) == 2
