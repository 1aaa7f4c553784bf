"""The calc-words task: seeded word problems and the warm start's chat demonstrations."""

from __future__ import annotations

import random

import pytest

from libra.jobspec import SUPPORTED_TASKS
from libra.tasks import TASKS, chat_demonstration, load_problems
from libra.tasks.arith import evaluate_expression


def test_problems_are_seeded_and_answers_are_the_expressions_value() -> None:
    problems = load_problems("calc-words", 3, 200)
    assert problems == load_problems("calc-words", 3, 200)
    assert problems != load_problems("calc-words", 4, 200)
    assert len({p.prompt_id for p in problems}) == 200
    for p in problems:
        assert p.answer == evaluate_expression(p.expression) >= 0
        assert "{" not in p.prompt and p.prompt.endswith("?")


def test_the_registry_is_the_specs_list_of_tasks() -> None:
    assert SUPPORTED_TASKS == tuple(TASKS) and "calc-words" in TASKS
    with pytest.raises(ValueError, match="num_prompts"):
        load_problems("calc-words", 0, 0)


def test_demonstrations_call_the_calculator_with_the_expression_or_guess() -> None:
    problem = load_problems("calc-words", 0, 1)[0]
    rng = random.Random(0)
    kinds = set()
    for _ in range(200):
        messages = chat_demonstration(problem, rng, failure_rate=0.25, max_turns=4)
        assert messages[0] == {"role": "user", "content": problem.prompt}
        assert messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
        calls = [c for m in messages for c in m.get("tool_calls", [])]
        assert all(c["arguments"] == {"expression": problem.expression} for c in calls)
        assert len(calls) <= 3  # max_turns - 1 calls, then the answer
        tools = [m["content"] for m in messages if m["role"] == "tool"]
        answered = messages[-1]["content"] == f"The answer is {problem.answer}."
        # The right number only ever follows a successful call: guesses are wrong.
        assert answered == (bool(tools) and tools[-1] == str(problem.answer))
        kinds.add(("guess" if not calls else "call") + ("-retry" if len(calls) > 1 else ""))
    assert kinds == {"guess", "call", "call-retry"}
