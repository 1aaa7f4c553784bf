"""Unit tests for the arithmetic tool-use task (pure Python)."""

import random

import pytest

from libra.tasks.arith import (
    ActionKind,
    ArithDataset,
    calculate,
    demonstration,
    evaluate_expression,
    format_tool_output,
    is_transient_failure,
    parse_action,
    reward,
)


def test_dataset_is_deterministic_per_seed_with_stable_prompt_ids():
    first, second = ArithDataset(3, 16), ArithDataset(3, 16)
    assert [p.prompt for p in first] == [p.prompt for p in second]
    assert first[5].prompt_id == "arith-3-5"
    assert [p.prompt for p in ArithDataset(4, 16)] != [p.prompt for p in first]


def test_dataset_answers_match_the_expression():
    for problem in ArithDataset(0, 64, max_ops=3):
        assert problem.prompt == f"Q:{problem.expression}="
        assert problem.answer == eval(problem.expression)  # noqa: S307 - trusted test data


@pytest.mark.parametrize(
    ("expression", "value"), [("2+3*4", 14), ("(2+3)*4", 20), ("10-4-3", 3), ("-5*2", -10)]
)
def test_evaluate_expression_follows_precedence(expression, value):
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize("expression", ["", "2+", "2**3", "__import__('os')", "1/2", "9" * 70])
def test_evaluate_expression_rejects_bad_input(expression):
    with pytest.raises(ValueError):
        evaluate_expression(expression)


def test_parse_action_reads_tool_calls_answers_and_malformed_turns():
    assert parse_action("<calc>1+2</calc>").kind is ActionKind.TOOL_CALL
    assert parse_action("<calc>1+2</calc>").argument == "1+2"
    assert parse_action("x<ans>3</ans>").argument == "3"
    assert parse_action("<ans>3").kind is ActionKind.MALFORMED


def test_calculate_is_deterministic_per_call_key_and_fails_at_the_configured_rate():
    outcomes = [calculate("6*7", f"traj:{index}", 0.25) for index in range(2000)]
    busy = sum(outcome == (False, "busy") for outcome in outcomes)
    assert 400 < busy < 600
    assert calculate("6*7", "traj:1", 0.25) == calculate("6*7", "traj:1", 0.25)
    assert calculate("6*7", "k", 0.0) == (True, "42")
    assert calculate("6*", "k", 0.0) == (False, "bad expr")
    assert not is_transient_failure("anything", 0.0)


def test_format_tool_output_wraps_results_and_errors():
    assert format_tool_output(True, "42") == "<res>42</res>"
    assert format_tool_output(False, "busy") == "<err>busy</err>"


def test_reward_is_one_only_for_the_exact_integer():
    problem = ArithDataset(0, 1)[0]
    assert reward(str(problem.answer), problem) == 1.0
    assert reward(f" {problem.answer} ", problem) == 1.0
    assert reward(str(problem.answer + 1), problem) == 0.0
    assert reward("abc", problem) == 0.0
    assert reward(None, problem) == 0.0


def test_demonstrations_follow_the_protocol_and_mix_behaviours():
    problems = ArithDataset(0, 50)
    rng = random.Random(0)
    num_direct = 0
    for problem in problems:
        segments = demonstration(problem, rng, max_turns=6)
        assert not segments[0].is_trainable and segments[0].text == problem.prompt
        assert segments[-1].is_trainable and segments[-1].text.startswith("<ans>")
        num_direct += len(segments) == 2
        for segment in segments[1:]:
            is_tool_output = segment.text.startswith(("<res>", "<err>"))
            assert segment.is_trainable != is_tool_output
        if segments[-2].text.startswith("<res>"):
            assert segments[-1].text == f"<ans>{problem.answer}</ans>"
    assert 10 < num_direct < 40
