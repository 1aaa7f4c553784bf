"""Arithmetic word problems for chat models that call a calculator (pure Python).

The ``calc-words`` task of the SmolLM2 example: each problem is a short story whose
answer is one integer expression of two or three operations on 2-3 digit numbers, so a
135M model cannot do it reliably in its head (it answers "What is 17*23?" with 381) and
the calculator pays. The prompt asks the model to call the tool and answer with a
number; the reward is ``numeric`` (the last number of the final message).

:func:`chat_demonstration` writes the conversations of the supervised warm start in
the OpenAI message format (the chat protocol renders them with the model's template):
some call the tool and copy its result, some retry after a ``busy`` error, and some
answer without calling (a guess), so RL has a habit to fix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from libra.tasks.arith import BUSY_MESSAGE, Problem, evaluate_expression
from libra.types import PromptId

TOOL_NAME = "calculator"
DEFAULT_SYSTEM_PROMPT = (
    "You solve math word problems. Call the calculator tool with the arithmetic "
    "expression, then reply with one sentence ending in the final number.")


@dataclass(frozen=True, slots=True)
class _Template:
    story: str
    expression: str


# {a}, {b}, {c}: operands; the expression is evaluated with the same names.
_TEMPLATES: tuple[_Template, ...] = (
    _Template("A baker bakes {a} trays of {b} rolls and sells {c} rolls. How many rolls "
              "are left?", "{a}*{b}-{c}"),
    _Template("Tom has {a} marbles and buys {b} bags of {c} marbles each. How many marbles "
              "does he have now?", "{a}+{b}*{c}"),
    _Template("A train covers {a} km every hour for {b} hours, then {c} km more. How far "
              "does it travel in total?", "{a}*{b}+{c}"),
    _Template("A shop had {a} lamps, sold {b} on Monday and {c} on Tuesday. How many lamps "
              "remain?", "{a}-{b}-{c}"),
    _Template("Each of {a} boxes holds {b} pens, and {c} more pens lie on the desk. How "
              "many pens are there?", "{a}*{b}+{c}"),
    _Template("A farm has {a} cows, {b} hens and a fence of {c} posts. How many cow legs, "
              "hen legs and posts are there in total?", "{a}*4+{b}*2+{c}"),
    _Template("Sara saves {a} dollars a week for {b} weeks and then spends {c} dollars. How "
              "much money does she have left?", "{a}*{b}-{c}"),
    _Template("A library gets {a} books, then {b} crates of {c} books. How many new books "
              "arrived?", "{a}+{b}*{c}"),
)


def calc_words_problems(seed: int, num_prompts: int) -> list[Problem]:
    """A fixed, seeded set of word problems (equal seeds give equal sets on every host).

    Operands are 12-99 (the multiplier 3-19) so products need a calculator; every answer
    is a non-negative integer.
    """
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be > 0, got {num_prompts}")
    rng = random.Random(seed)
    return [_make_problem(PromptId(f"calc-{seed}-{index}"), rng) for index in range(num_prompts)]


def _make_problem(prompt_id: PromptId, rng: random.Random) -> Problem:
    while True:
        template = rng.choice(_TEMPLATES)
        values = {"a": rng.randint(12, 99), "b": rng.randint(3, 19), "c": rng.randint(12, 99)}
        expression = template.expression.format(**values)
        answer = evaluate_expression(expression)
        if answer >= 0:
            return Problem(prompt_id, template.story.format(**values), expression, answer)


def _call(expression: str) -> dict[str, Any]:
    return {"name": TOOL_NAME, "arguments": {"expression": expression}}


def chat_demonstration(problem: Problem, rng: random.Random, *,
                       direct_answer_prob: float = 0.3, retry_prob: float = 0.6,
                       failure_rate: float = 0.25, max_turns: int = 6) -> list[dict[str, Any]]:
    """One warm-start conversation (user, then assistant/tool messages) for ``problem``.

    Assistant messages carry ``tool_calls`` as ``[{"name", "arguments"}]``; tool
    messages carry ``content`` (the calculator's output or its error).
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": problem.prompt}]
    guess = str(problem.answer + rng.choice((-10, -1, 1, 10, 100)))
    if rng.random() < direct_answer_prob:
        return [*messages, {"role": "assistant", "content": f"The answer is {guess}."}]
    for _ in range(max_turns - 1):
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [_call(problem.expression)]})
        if rng.random() >= failure_rate:
            messages.append({"role": "tool", "name": TOOL_NAME,
                             "content": str(problem.answer)})
            return [*messages, {"role": "assistant",
                                "content": f"The answer is {problem.answer}."}]
        messages.append({"role": "tool", "name": TOOL_NAME, "content": f"error: {BUSY_MESSAGE}"})
        if rng.random() >= retry_prob:
            break
    return [*messages, {"role": "assistant", "content": f"The answer is {guess}."}]
