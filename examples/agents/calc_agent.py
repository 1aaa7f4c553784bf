"""A small agent program written against the OpenAI API, trained by Libra unchanged.

It solves one arithmetic word problem: it asks the model (the policy Libra trains,
behind ``OPENAI_BASE_URL``) with a ``calculator`` tool, runs every calculator call
itself, sends the results back, and stops when the model answers without a call (or
after ``MAX_TURNS``). It never computes a reward: it closes its episode without one and
the job's reward (``numeric``, against the dataset's answer) scores the last reply.

Run by ``libra agent run`` (docs/agent-endpoint.md), which sets OPENAI_BASE_URL,
OPENAI_API_KEY, LIBRA_MODEL, LIBRA_EPISODE_ID and the problem in LIBRA_PROMPT (and on
stdin). Try it by hand against a running job:

    libra agent run --job JOB --command "python examples/agents/calc_agent.py"
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys

import httpx
from openai import OpenAI

MAX_TURNS = 4
# The calc-words task's own system prompt and the gateway's calculator schema: the
# job's warm start (sft_steps) demonstrates exactly this format.
SYSTEM = ("You solve math word problems. Call the calculator tool with the arithmetic "
          "expression, then reply with one sentence ending in the final number.")
TOOLS = [{"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"], "additionalProperties": False}}}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> str:
    """The calculator this agent runs itself: arithmetic only, no names, no calls."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(value(node.right)) > 16:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / // % ** ( )")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def solve(client: OpenAI, model: str, problem: str) -> str:
    """Chat with the model until it answers; returns its last reply."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": problem}]
    reply = ""
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        reply = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculate(str(expression))})
    return reply


def main() -> int:
    base_url, api_key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    problem = os.environ.get("LIBRA_PROMPT") or sys.stdin.read()
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=2)
    model = os.environ.get("LIBRA_MODEL") or client.models.list().data[0].id
    solve(client, model, problem)
    # No reward of its own: the job's reward scores the last reply.
    httpx.post(f"{base_url}/episodes/{os.environ['LIBRA_EPISODE_ID']}/reward", json={},
               headers={"Authorization": f"Bearer {api_key}"}, timeout=30.0).raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
