"""The chat agent loop of one trajectory (pure) over a real chat template and tokenizer
(the tiny Qwen2 and Llama fixtures): prompt with tools, Hermes calls, tool turns after a
closed and a cut turn, and what the trainer will see."""

from __future__ import annotations

import json

import pytest

from libra import types as t
from libra.chat.job import chat_format, openai_tools
from libra.jobspec import JobSpec, ModelSpec, TaskSpec, ToolSchema, ToolsSpec
from libra.models.hf import load_tokenizer
from services.rollout import agent
from services.rollout.agent_registry import build_agent
from services.rollout.backend import HfTokenizer
from services.rollout.engine_types import GenerationResult
from tests.fakes.toolgateway import tool_result

CALC = ToolSchema(name="calculator", description="Evaluate arithmetic.",
                  parameters_json=json.dumps({"type": "object", "properties": {
                      "expression": {"type": "string"}}}))


def spec(max_turns: int = 4) -> JobSpec:
    return JobSpec(model=ModelSpec(kind="hf", path="/unused"),
                   task=TaskSpec(name="calc-words", max_turns=max_turns,
                                 max_new_tokens_per_turn=64, tool_call_format="hermes"),
                   tools=ToolsSpec(schemas=[CALC]))


@pytest.fixture(params=["qwen2", "llama"])
def tok(request, hf_model_dir) -> HfTokenizer:
    hf = load_tokenizer(str(hf_model_dir(request.param)))
    return HfTokenizer(hf, [hf.eos_token_id], 4096)


def new_traj() -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId("tr-1"), t.JobId("job-1"), t.GroupId("g-1"),
                        t.PromptId("p-1"), "What is 12*7?", "84")


def turn(tok: HfTokenizer, text: str, reason: str = "stop") -> GenerationResult:
    ids = tok.encode(text)
    return GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=reason,
                            policy_version=3)


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'


def test_the_prompt_is_the_chat_formats_rendering_with_the_jobs_tools(tok) -> None:
    loop = build_agent(spec(), tok)
    traj = new_traj()
    loop.start(traj)
    chat = chat_format(spec(), tok.tokenizer)
    assert traj.token_ids == chat.prompt_ids([{"role": "user", "content": "What is 12*7?"}])
    assert '"name": "calculator"' in tok.decode(traj.token_ids)
    assert traj.loss_mask == [0] * traj.num_prompt_tokens
    assert openai_tools(spec())[0]["function"]["parameters"]["type"] == "object"


def test_a_hermes_turn_asks_for_its_calls_and_a_plain_turn_answers(tok) -> None:
    loop = build_agent(spec(), tok)
    traj = new_traj()
    loop.start(traj)
    outcome = loop.apply_generation(traj, turn(tok, CALL + "<|im_end|>"))
    assert not outcome.finished
    assert [(c.name, c.arguments) for c in outcome.calls] == [("calculator",
                                                               {"expression": "12*7"})]
    final = loop.apply_generation(traj, turn(tok, "The answer is 84.<|im_end|>"))
    assert (final.finished, final.final_answer) == (True, "The answer is 84.")


def test_the_tool_turn_is_what_the_template_renders_and_is_not_trained(tok) -> None:
    loop = build_agent(spec(), tok)
    chat = chat_format(spec(), tok.tokenizer)
    traj = new_traj()
    loop.start(traj)
    loop.apply_generation(traj, turn(tok, CALL + "<|im_end|>"))
    before = len(traj.token_ids)
    loop.apply_tool_results(traj, [agent.ToolTurnResult("calculator", tool_result("84"))])
    expected = chat.tool_turn_ids([{"role": "tool", "name": "calculator", "content": "84"}],
                                  turn_closed=True)
    assert traj.token_ids[before:] == expected
    assert traj.loss_mask[before:] == [0] * len(expected)
    assert traj.tool_states == [tool_result("84").state]
    assert traj.check_aligned() is None
    assert tok.decode(traj.token_ids).endswith("<|im_start|>assistant\n")


def test_a_turn_cut_by_its_budget_is_closed_before_the_tool_turn(tok) -> None:
    loop = build_agent(spec(), tok)
    chat = chat_format(spec(), tok.tokenizer)
    traj = new_traj()
    loop.start(traj)
    outcome = loop.apply_generation(traj, turn(tok, '<tool_call>\n{"name": "calc', "length"))
    assert outcome.errors and not outcome.calls and not outcome.finished
    before = len(traj.token_ids)
    loop.apply_tool_results(traj, [agent.ToolTurnResult(
        agent.INVALID_TOOL_TYPE, agent.invalid_call_result(outcome.errors[0]))])
    added = tok.decode(traj.token_ids[before:])
    assert added.startswith(chat.end_of_turn_text)
    assert "error: tool call 1 is not closed" in added


def test_a_failed_call_reads_as_an_error_message(tok) -> None:
    loop = build_agent(spec(), tok)
    traj = new_traj()
    loop.start(traj)
    loop.apply_generation(traj, turn(tok, CALL + "<|im_end|>"))
    loop.apply_tool_results(traj, [agent.ToolTurnResult("calculator",
                                                        tool_result("busy", ok=False))])
    assert "error: busy" in tok.decode(traj.token_ids[traj.num_prompt_tokens:])


def test_the_turn_limit_ends_a_trajectory_that_still_calls(tok) -> None:
    loop = build_agent(spec(max_turns=1), tok)
    traj = new_traj()
    loop.start(traj)
    outcome = loop.apply_generation(traj, turn(tok, CALL + "<|im_end|>"))
    assert (outcome.finished, outcome.final_answer) == (True, None)


def test_requests_stop_on_the_chat_formats_stop_tokens(tok) -> None:
    loop = build_agent(spec(), tok)
    traj = new_traj()
    loop.start(traj)
    request = loop.next_request(traj, seed=1)
    assert request is not None
    assert request.stop_token_ids == chat_format(spec(), tok.tokenizer).stop_token_ids


def test_a_chat_job_without_tool_schemas_is_a_clear_error(tok) -> None:
    bare = JobSpec(model=ModelSpec(kind="hf", path="/unused"),
                   task=TaskSpec(tool_call_format="hermes"))
    with pytest.raises(ValueError, match="tools.schemas has no entry for enabled tool"):
        build_agent(bare, tok)


# -- prompts from a messages dataset --------------------------------------------------

ROW_MESSAGES = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Add 2 and 3."},
                {"role": "assistant", "content": "Which tool?"},
                {"role": "user", "content": "The calculator."}]


def test_a_messages_row_is_rendered_as_its_messages(tok) -> None:
    traj = new_traj()
    traj.prompt_messages_json = json.dumps(ROW_MESSAGES)
    build_agent(spec(), tok).start(traj)
    # Its own system message replaces the job's default; every message is in the prompt.
    assert traj.token_ids == chat_format(spec(), tok.tokenizer).prompt_ids(ROW_MESSAGES)
    assert "You are terse." in tok.decode(traj.token_ids)
    assert traj.num_prompt_tokens == len(traj.token_ids)


def test_a_text_prompt_still_renders_as_one_user_message(tok) -> None:
    traj = new_traj()
    build_agent(spec(), tok).start(traj)
    assert traj.token_ids == chat_format(spec(), tok.tokenizer).prompt_ids(
        [{"role": "user", "content": traj.prompt_text}])


@pytest.mark.parametrize("bad", ["not json", '{"role": "user"}', '["user"]'])
def test_malformed_messages_raise_value_error(tok, bad: str) -> None:
    traj = new_traj()
    traj.prompt_messages_json = bad
    with pytest.raises(ValueError, match="prompt_messages_json"):
        build_agent(spec(), tok).start(traj)
    assert traj.token_ids == []


def test_the_transcript_has_the_turns_calls_and_tool_returns(tok) -> None:
    loop = build_agent(spec(), tok)
    traj = new_traj()
    loop.start(traj)
    outcome = loop.apply_generation(traj, turn(tok, CALL))
    loop.apply_tool_results(traj, [agent.ToolTurnResult("calculator", tool_result("84"))])
    loop.apply_generation(traj, turn(tok, "It is 84."))
    messages = loop.transcript(traj)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[0].content == "What is 12*7?"
    (call,) = messages[1].tool_calls
    assert (call.name, json.loads(call.arguments_json)) == ("calculator", {"expression": "12*7"})
    assert outcome.calls[0].name == "calculator"
    assert (messages[2].name, messages[2].tool_status) == ("calculator", "success")
    assert "84" in messages[2].content
    assert messages[3].content.strip() == "It is 84."


def test_each_of_several_returns_gets_its_own_text_in_the_transcript(tok) -> None:
    loop = build_agent(spec(), tok)
    traj = new_traj()
    loop.start(traj)
    loop.apply_generation(traj, turn(tok, CALL + "\n" + CALL.replace("12*7", "1+1")))
    loop.apply_tool_results(traj, [agent.ToolTurnResult("calculator", tool_result("84")),
                                   agent.ToolTurnResult("calculator", tool_result("2"))])
    loop.apply_generation(traj, turn(tok, "84 and 2."))
    tools = [m for m in loop.transcript(traj) if m.role == "tool"]
    # Both fixtures' renderings wrap each return in <tool_response> (Qwen2's own template,
    # the shipped Hermes one for Llama).
    assert [m.content for m in tools] == ["84", "2"]
