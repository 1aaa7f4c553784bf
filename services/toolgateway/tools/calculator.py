"""``calculator`` tool: safe arithmetic on an AST whitelist.

Allowed: int/float literals, ``+ - * / // % **``, unary minus/plus, parentheses. No
names, calls, attributes or other node types. Errors are short lowercase words because a
tiny character-level model reads them: "syntax", "not allowed", "divide by zero",
"too large", "too long", "busy". "busy" is an injected transient failure, chosen
deterministically from hash(seed, call_id): it mirrors a flaky real tool so the model
learns to retry (with a new call id). It is surfaced to the model, not retried here.
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
from dataclasses import dataclass
from typing import Any

from services.toolgateway.tools.base import ToolContext, ToolOutput

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


@dataclass(frozen=True, kw_only=True, slots=True)
class CalculatorConfig:
    """Bounds and failure injection of the calculator."""

    max_expression_chars: int = 200
    """Longer expressions fail with "too long"."""
    max_abs_value: float = 1e15
    """Any intermediate or final result beyond this magnitude fails with "too large"."""
    max_exponent: int = 64
    """Largest absolute exponent allowed for ``**``."""
    transient_failure_rate: float = 0.0
    """Share of call ids (0..1) that fail with "busy"."""
    seed: int = 0
    """Seed of the deterministic failure choice."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.transient_failure_rate <= 1.0:
            raise ValueError(
                f"transient_failure_rate must be in [0, 1], got {self.transient_failure_rate}"
            )


class CalcError(Exception):
    """Evaluation failed; ``str(exc)`` is the model-facing message."""


def format_number(value: int | float) -> str:
    """Integers (and integral floats) without ".0"; other floats via ``repr``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class SafeEvaluator:
    """Evaluates an arithmetic expression within the configured bounds."""

    def __init__(self, config: CalculatorConfig) -> None:
        self._config = config

    def evaluate(self, expression: str) -> int | float:
        """Evaluate ``expression`` or raise ``CalcError``."""
        if len(expression) > self._config.max_expression_chars:
            raise CalcError("too long")
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except (SyntaxError, ValueError):
            raise CalcError("syntax") from None
        return self._eval(tree.body)

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self._bounded(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return self._bounded(_UNARY[type(node.op)](self._eval(node.operand)))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            return self._bounded(self._apply(node.op, left, right))
        raise CalcError("not allowed")

    def _apply(self, op: ast.operator, left: int | float, right: int | float) -> int | float:
        # Bound the exponent before computing: 9**9**9 must never be evaluated.
        if isinstance(op, ast.Pow) and abs(right) > self._config.max_exponent:
            raise CalcError("too large")
        try:
            return _BINARY[type(op)](left, right)
        except ZeroDivisionError:
            raise CalcError("divide by zero") from None
        except OverflowError:
            raise CalcError("too large") from None

    def _bounded(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise CalcError("not allowed")  # e.g. (-8) ** 0.5
        if isinstance(value, float) and not math.isfinite(value):
            raise CalcError("too large")
        if abs(value) > self._config.max_abs_value:
            raise CalcError("too large")
        return value


def is_transient_failure(seed: int, call_id: str, rate: float) -> bool:
    """Deterministic Bernoulli(rate) draw from hash(seed, call_id)."""
    digest = hashlib.sha256(f"{seed}:{call_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


class CalculatorTool:
    """Built-in ``calculator``: ``{"expression": "..."}`` -> the number as text."""

    name = "calculator"
    description = "Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."
    idempotent = True
    timeout_s = 1.0

    def __init__(self, config: CalculatorConfig | None = None) -> None:
        self._config = config or CalculatorConfig()
        self._evaluator = SafeEvaluator(self._config)
        self.args_schema = {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        }

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Evaluate ``args["expression"]``."""
        cfg = self._config
        # A job may set its own failure rate (job spec tools.calculator_transient_failure_rate).
        rate = float(ctx.options.get("transient_failure_rate", cfg.transient_failure_rate))
        if is_transient_failure(cfg.seed, ctx.call_id, rate):
            return ToolOutput(ok=False, error="busy")
        try:
            value = self._evaluator.evaluate(args["expression"])
            return ToolOutput(ok=True, output=format_number(value))
        except CalcError as exc:
            return ToolOutput(ok=False, error=str(exc))
