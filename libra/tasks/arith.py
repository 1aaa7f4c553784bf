"""Arithmetic tool-use task: the workload of the demo RL loop.

The rollout core renders ``Problem.prompt`` for the policy, parses each generated turn
with :func:`parse_action`, sends tool calls to the calculator (whose reference semantics
are :func:`calculate`), appends :func:`format_tool_output` as non-trainable context, and
scores the final answer with :func:`reward`. The trainer's supervised warm start uses
:func:`demonstration`, which speaks exactly the same protocol.

Protocol, in text (each tag is one token of the tiny model's tokenizer)::

    Q:37+58*2=<calc>37+58*2</calc><err>busy</err><calc>37+58*2</calc><res>153</res><ans>153</ans>

The module is pure Python on purpose: the rollout core, the tool gateway and the
simulator import it without torch.
"""

from __future__ import annotations

import enum
import hashlib
import random
import re
from dataclasses import dataclass

from libra.types import PromptId

CALC_OPEN, CALC_CLOSE = "<calc>", "</calc>"
RES_OPEN, RES_CLOSE = "<res>", "</res>"
ERR_OPEN, ERR_CLOSE = "<err>", "</err>"
ANS_OPEN, ANS_CLOSE = "<ans>", "</ans>"
TAGS: tuple[str, ...] = (
    CALC_OPEN,
    CALC_CLOSE,
    RES_OPEN,
    RES_CLOSE,
    ERR_OPEN,
    ERR_CLOSE,
    ANS_OPEN,
    ANS_CLOSE,
)
# A turn ends at the first closing action tag; each is a single token, so engines may
# stop on token ids instead of matching strings.
STOP_STRINGS: tuple[str, ...] = (CALC_CLOSE, ANS_CLOSE)

TOOL_NAME = "calculator"
BUSY_MESSAGE = "busy"
BAD_EXPRESSION_MESSAGE = "bad expr"
DEFAULT_TRANSIENT_FAILURE_RATE = 0.25
DEFAULT_MAX_TURNS = 6
# Bounds keep a hostile or degenerate expression from costing the calculator real work.
MAX_EXPRESSION_CHARS = 64
MAX_ABS_VALUE = 10**12

_OPERATORS = ("+", "-", "*")
_ACTION_RE = re.compile(r"<calc>(.*?)</calc>|<ans>(.*?)</ans>", re.DOTALL)
_TOKEN_RE = re.compile(r"\s*(\d+|[+\-*()])")


@dataclass(frozen=True, slots=True)
class Problem:
    """One prompt of the dataset.

    Attributes:
        prompt_id: Stable id; the same prompt recurs across RL steps under this id.
        prompt: Text shown to the policy, e.g. ``Q:37+58*2=``.
        expression: The arithmetic expression inside the prompt.
        answer: The exact integer value of ``expression``.
    """

    prompt_id: PromptId
    prompt: str
    expression: str
    answer: int


class ArithDataset:
    """A fixed, seeded set of 1-3 operation problems over ``+ - *``.

    Args:
        seed: Seeds the generator; equal seeds give equal datasets on every host.
        num_prompts: Number of problems.
        min_operand: Smallest operand.
        max_operand: Largest operand; small operands keep tool outputs short, which keeps
            the copy task learnable for a tiny model.
        max_ops: Largest number of operators per expression (at least 1). The defaults
            (operands up to 50, at most 2 operators) are what the tiny policy learns to
            copy reliably within the demo's budget.
    """

    def __init__(
        self,
        seed: int,
        num_prompts: int,
        *,
        min_operand: int = 1,
        max_operand: int = 50,
        max_ops: int = 2,
    ) -> None:
        if num_prompts <= 0 or max_ops < 1 or not 0 <= min_operand <= max_operand:
            raise ValueError(
                f"bad dataset shape: num_prompts={num_prompts} max_ops={max_ops} "
                f"operands=[{min_operand}, {max_operand}]"
            )
        rng = random.Random(seed)
        self._problems = [
            _make_problem(PromptId(f"arith-{seed}-{index}"), rng, min_operand, max_operand, max_ops)
            for index in range(num_prompts)
        ]

    def __len__(self) -> int:
        return len(self._problems)

    def __getitem__(self, index: int) -> Problem:
        return self._problems[index]

    def __iter__(self):
        return iter(self._problems)


def _make_problem(
    prompt_id: PromptId, rng: random.Random, low: int, high: int, max_ops: int
) -> Problem:
    num_ops = rng.randint(1, max_ops)
    parts = [str(rng.randint(low, high))]
    for _ in range(num_ops):
        parts.append(rng.choice(_OPERATORS))
        parts.append(str(rng.randint(low, high)))
    expression = "".join(parts)
    return Problem(prompt_id, f"Q:{expression}=", expression, evaluate_expression(expression))


class ActionKind(enum.Enum):
    """What one generated turn asks for."""

    TOOL_CALL = "tool_call"
    ANSWER = "answer"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Action:
    """A parsed turn: ``argument`` is the tool input or the answer text ('' if malformed)."""

    kind: ActionKind
    argument: str = ""


def parse_action(text: str) -> Action:
    """Parse one generated turn.

    The first complete ``<calc>..</calc>`` or ``<ans>..</ans>`` wins; text around it is
    ignored so that a stray token before the tag does not waste the whole episode.

    Args:
        text: The decoded turn, normally ending with a stop tag.

    Returns:
        The action; ``MALFORMED`` when no complete tag pair is present (e.g. the turn hit
        its token limit).
    """
    match = _ACTION_RE.search(text)
    if match is None:
        return Action(ActionKind.MALFORMED)
    if match.group(1) is not None:
        return Action(ActionKind.TOOL_CALL, match.group(1))
    return Action(ActionKind.ANSWER, match.group(2))


def format_tool_output(ok: bool, output: str) -> str:
    """Render a tool return as the context appended after a tool call (not trained on)."""
    if ok:
        return f"{RES_OPEN}{output}{RES_CLOSE}"
    return f"{ERR_OPEN}{output}{ERR_CLOSE}"


def reward(final_answer_text: str | None, problem: Problem) -> float:
    """Outcome reward in [0, 1]: 1 when the answer is exactly the right integer.

    Args:
        final_answer_text: The argument of the final ``<ans>`` action, or None when the
            episode ended without one (malformed turn or turn limit).
        problem: The problem being answered.
    """
    if final_answer_text is None:
        return 0.0
    text = final_answer_text.strip()
    if not re.fullmatch(r"-?\d{1,15}", text):
        return 0.0
    return 1.0 if int(text) == problem.answer else 0.0


def evaluate_expression(expression: str) -> int:
    """Evaluate an integer expression over ``+ - *`` and parentheses, without ``eval``.

    Raises:
        ValueError: On any syntax error, over-long input or out-of-range value.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError("expression too long")
    tokens = _tokenize_expression(expression)
    value, position = _parse_sum(tokens, 0)
    if position != len(tokens):
        raise ValueError(f"unexpected token at {position}")
    return value


def _tokenize_expression(expression: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    stripped_end = len(expression.rstrip())
    while position < stripped_end:
        match = _TOKEN_RE.match(expression, position)
        if match is None:
            raise ValueError(f"bad character at {position}")
        tokens.append(match.group(1))
        position = match.end()
    if not tokens:
        raise ValueError("empty expression")
    return tokens


def _parse_sum(tokens: list[str], position: int) -> tuple[int, int]:
    value, position = _parse_product(tokens, position)
    while position < len(tokens) and tokens[position] in ("+", "-"):
        operator = tokens[position]
        right, position = _parse_product(tokens, position + 1)
        value = _checked(value + right if operator == "+" else value - right)
    return value, position


def _parse_product(tokens: list[str], position: int) -> tuple[int, int]:
    value, position = _parse_atom(tokens, position)
    while position < len(tokens) and tokens[position] == "*":
        right, position = _parse_atom(tokens, position + 1)
        value = _checked(value * right)
    return value, position


def _parse_atom(tokens: list[str], position: int) -> tuple[int, int]:
    if position >= len(tokens):
        raise ValueError("unexpected end")
    token = tokens[position]
    if token == "-":
        value, position = _parse_atom(tokens, position + 1)
        return -value, position
    if token == "(":
        value, position = _parse_sum(tokens, position + 1)
        if position >= len(tokens) or tokens[position] != ")":
            raise ValueError("missing )")
        return value, position + 1
    if token.isdigit():
        return _checked(int(token)), position + 1
    raise ValueError(f"unexpected {token!r}")


def _checked(value: int) -> int:
    if abs(value) > MAX_ABS_VALUE:
        raise ValueError("value out of range")
    return value


def is_transient_failure(call_key: str, failure_rate: float) -> bool:
    """Whether the simulated calculator is 'busy' for this call.

    Deterministic per call key (a hash, not a random draw) so that a replayed or retried
    RPC for the same call sees the same outcome on every host.
    """
    digest = hashlib.sha256(call_key.encode("utf-8")).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64
    return unit < failure_rate


def calculate(
    expression: str, call_key: str, failure_rate: float = DEFAULT_TRANSIENT_FAILURE_RATE
) -> tuple[bool, str]:
    """Reference semantics of the calculator tool.

    Args:
        expression: The tool argument as generated by the policy.
        call_key: Unique id of this call (e.g. ``"<trajectory_id>:<turn>"``); decides the
            simulated transient failure.
        failure_rate: Probability of the transient ``busy`` failure.

    Returns:
        ``(ok, output)``: ``(True, "153")``, ``(False, "busy")`` or ``(False, "bad expr")``.
    """
    if is_transient_failure(call_key, failure_rate):
        return False, BUSY_MESSAGE
    try:
        return True, str(evaluate_expression(expression))
    except ValueError:
        return False, BAD_EXPRESSION_MESSAGE


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a demonstration; only trainable segments contribute to the SFT loss."""

    text: str
    is_trainable: bool


def demonstration(
    problem: Problem,
    rng: random.Random,
    *,
    direct_answer_prob: float = 0.65,
    retry_prob: float = 0.6,
    failure_rate: float = DEFAULT_TRANSIENT_FAILURE_RATE,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> list[Segment]:
    """One supervised demonstration, deliberately a mixture of good and bad habits.

    With ``direct_answer_prob`` the demo answers without the tool. Otherwise it calls
    the tool and copies the result; after a ``busy`` error it retries with
    ``retry_prob`` and otherwise answers without a result. RL then has a clear,
    learnable fix: always call, always retry.

    Answers without a result are a guess that echoes the last operand. A correct answer
    there would teach the tiny model to "compute" after ``<ans>``, which it cannot, and
    that habit competes with copying the tool result (measured: copy accuracy fell from
    ~0.7 to ~0.1 with correct direct answers). With the echo, every answer is "copy the
    most recent number", one skill the short SFT learns, and guesses almost never score.

    Args:
        problem: The problem to demonstrate.
        rng: Source of the mixture choices and the simulated calculator failures.
        direct_answer_prob: Probability of answering without calling the tool.
        retry_prob: Probability of retrying after a transient failure.
        failure_rate: Probability that a calculator call comes back ``busy``.
        max_turns: Turn limit of the agent loop; a demo never exceeds it.

    Returns:
        Segments in order: the prompt (not trainable), then model turns (trainable)
        interleaved with tool outputs (not trainable).
    """
    segments = [Segment(problem.prompt, False)]
    guess_turn = Segment(f"{ANS_OPEN}{_last_operand(problem.expression)}{ANS_CLOSE}", True)
    if rng.random() < direct_answer_prob:
        return [*segments, guess_turn]
    call_turn = Segment(f"{CALC_OPEN}{problem.expression}{CALC_CLOSE}", True)
    for _ in range(max_turns - 1):
        segments.append(call_turn)
        if rng.random() >= failure_rate:
            segments.append(Segment(format_tool_output(True, str(problem.answer)), False))
            break
        segments.append(Segment(format_tool_output(False, BUSY_MESSAGE), False))
        if rng.random() >= retry_prob:
            return [*segments, guess_turn]
    else:
        # Every call in the turn budget failed: the demo can only guess.
        return [*segments, guess_turn]
    return [*segments, Segment(f"{ANS_OPEN}{problem.answer}{ANS_CLOSE}", True)]


def _last_operand(expression: str) -> str:
    return re.findall(r"\d+", expression)[-1]
