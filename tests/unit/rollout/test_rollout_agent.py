"""The arith agent loop of one trajectory (pure), over the tiny model's real tokenizer."""

from __future__ import annotations

import pytest

from libra import types as t
from libra.jobspec import AlgorithmSpec, JobSpec, TaskSpec
from services.rollout import agent
from services.rollout.engine_types import GenerationResult
from tests.fakes.engine import make_tokenizer
from tests.fakes.toolgateway import tool_result


def make_task(prompt: str = "Q:1+2=", reference: str = "3") -> t.Trajectory:
    return t.Trajectory(t.TrajectoryId("tr-1"), t.JobId("job-1"), t.GroupId("g-1"),
                        t.PromptId("p-1"), prompt, reference)


def make_spec(max_turns: int = 3, max_new: int = 24) -> JobSpec:
    return JobSpec(task=TaskSpec(max_turns=max_turns, max_new_tokens_per_turn=max_new),
                   algorithm=AlgorithmSpec(temperature=0.7, top_p=0.9))


def turn(text: str, version: int = 4, logprob: float = -0.25) -> GenerationResult:
    ids = make_tokenizer().encode(text)
    return GenerationResult(token_ids=ids, logprobs=[logprob] * len(ids), finish_reason="stop",
                            policy_version=version)


def arith(tok=None, spec: JobSpec | None = None) -> agent.ArithAgent:
    return agent.ArithAgent(spec or make_spec(), tok or make_tokenizer())


def started(tokenizer=None, **kwargs) -> t.Trajectory:
    traj = make_task(**kwargs)
    arith(tokenizer).start(traj)
    return traj


def tool_turn(text: str, ok: bool = True) -> list[agent.ToolTurnResult]:
    return [agent.ToolTurnResult("calculator", tool_result(text, ok=ok))]


def test_start_tokenizes_prompt_with_mask_zero_and_version_minus_one() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    assert traj.token_ids == tok.encode_prompt("Q:1+2=")
    assert traj.num_prompt_tokens == len(traj.token_ids) == 7
    assert traj.loss_mask == [0] * 7
    assert traj.logprobs == [0.0] * 7
    assert traj.token_versions == [-1] * 7


def test_start_keeps_the_tokens_of_a_handed_over_trajectory() -> None:
    traj = make_task()
    traj.token_ids, traj.loss_mask = [1, 2, 3], [0, 0, 1]
    traj.logprobs, traj.token_versions, traj.num_prompt_tokens = [0.0, 0.0, -1.0], [-1, -1, 2], 2
    arith().start(traj)
    assert traj.token_ids == [1, 2, 3] and traj.loss_mask == [0, 0, 1]


def test_apply_generation_appends_trainable_tokens_with_logprobs_and_version() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    result = turn("<calc>1+2</calc>", version=4, logprob=-0.25)
    arith(tok).apply_generation(traj, result)
    n = len(result.token_ids)
    assert traj.token_ids[-n:] == result.token_ids
    assert traj.loss_mask[-n:] == [1] * n
    assert traj.logprobs[-n:] == [-0.25] * n
    assert traj.token_versions[-n:] == [4] * n
    assert traj.num_turns == 1
    assert traj.check_aligned() is None


def test_apply_generation_answer_finishes_with_the_answer() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    outcome = arith(tok).apply_generation(traj, turn("<ans>3</ans>"))
    assert (outcome.finished, outcome.final_answer) == (True, "3")


def test_apply_generation_tool_call_continues_with_the_expression() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    outcome = arith(tok).apply_generation(traj, turn("<calc>1+2</calc>"))
    assert not outcome.finished
    assert [(c.name, c.arguments) for c in outcome.calls] == [("calculator",
                                                               {"expression": "1+2"})]


def test_apply_generation_malformed_turn_finishes_without_answer() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    outcome = arith(tok).apply_generation(traj, turn("12+"))
    assert (outcome.finished, outcome.final_answer) == (True, None)


def test_apply_generation_tool_call_at_max_turns_finishes_without_answer() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    spec = make_spec(max_turns=2)
    first = arith(tok, spec).apply_generation(traj, turn("<calc>1+2</calc>"))
    second = arith(tok, spec).apply_generation(traj, turn("<calc>1+2</calc>"))
    assert not first.finished
    assert (second.finished, second.final_answer) == (True, None)


def test_apply_tool_result_appends_untrained_tokens_and_records_state() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    arith(tok).apply_generation(traj, turn("<calc>1+2</calc>"))
    before = len(traj.token_ids)
    results = tool_turn("3")
    arith(tok).apply_tool_results(traj, results)
    added = tok.encode("<res>3</res>")
    assert traj.token_ids[before:] == added
    assert traj.loss_mask[before:] == [0] * len(added)
    assert traj.logprobs[before:] == [0.0] * len(added)
    assert traj.token_versions[before:] == [-1] * len(added)
    assert traj.tool_states == [results[0].result.state]
    assert traj.tool_return_positions == [len(traj.token_ids) - traj.num_prompt_tokens]


def test_apply_tool_result_renders_a_failed_call_as_an_error() -> None:
    tok = make_tokenizer()
    traj = started(tok)
    before = len(traj.token_ids)
    arith(tok).apply_tool_results(traj, tool_turn("busy", ok=False))
    assert tok.decode(traj.token_ids[before:]) == "<err>busy</err>"


def test_apply_tool_result_is_truncated_to_the_context() -> None:
    tok = make_tokenizer(max_context_tokens=9)
    traj = started(tok)  # 7 tokens
    arith(tok).apply_tool_results(traj, tool_turn("12345"))
    assert len(traj.token_ids) == 9 and traj.check_aligned() is None


def test_next_request_carries_context_and_sampling_params() -> None:
    tok = make_tokenizer(max_context_tokens=100)
    traj = started(tok)
    request = arith(tok, make_spec(max_new=24)).next_request(traj, seed=7)
    assert request is not None
    assert request.prompt_token_ids == traj.token_ids
    assert request.max_new_tokens == 24
    assert (request.temperature, request.top_p, request.seed) == (0.7, 0.9, 7)
    assert request.stop_token_ids == tok.stop_token_ids


def test_eval_trajectory_samples_at_the_eval_temperature() -> None:
    """Held-out eval turns use task.eval_temperature (0: greedy); training keeps 0.7."""
    tok = make_tokenizer(max_context_tokens=100)
    spec = JobSpec(task=TaskSpec(eval_temperature=0.0), algorithm=AlgorithmSpec(temperature=0.7))
    training, evaluated = started(tok), started(tok)
    evaluated.eval_round = 2
    assert arith(tok, spec).next_request(training, seed=None).temperature == 0.7
    assert arith(tok, spec).next_request(evaluated, seed=None).temperature == 0.0


def test_next_request_is_capped_by_the_room_left() -> None:
    tok = make_tokenizer(max_context_tokens=10)
    request = arith(tok, make_spec(max_new=24)).next_request(started(tok), seed=None)
    assert request is not None and request.max_new_tokens == 3


def test_next_request_is_none_when_the_context_is_full() -> None:
    tok = make_tokenizer(max_context_tokens=7)
    assert arith(tok).next_request(started(tok), seed=None) is None


def test_arith_agent_refuses_a_messages_prompt() -> None:
    traj = make_task()
    traj.prompt_messages_json = '[{"role": "user", "content": "1+2?"}]'
    with pytest.raises(ValueError, match="text prompts only"):
        arith().start(traj)
    assert traj.token_ids == []
