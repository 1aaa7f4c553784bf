"""Tool-call formats: how a sampled assistant turn asks for tools (pure Python).

The agent loop decodes each sampled turn and hands the text to the task's parser
(``task.tool_call_format``), which splits it into well-formed calls, model-facing error
messages for malformed ones, and the final answer when the turn ends the trajectory.
``render_call`` is the inverse for one call: the text a model should emit, used to
build supervised demonstrations that speak exactly what the parser reads.

``PARSERS`` is the only list of formats; :func:`get_parser` looks one up by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from libra.tasks import arith


@dataclass(frozen=True)
class ToolCall:
    """One well-formed tool call.

    Attributes:
        name: The tool (function) name.
        arguments: The decoded JSON arguments object.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI-style ``tool_calls`` entry of an assistant message."""
        return {"type": "function",
                "function": {"name": self.name, "arguments": dict(self.arguments)}}

    @classmethod
    def from_openai(cls, entry: dict[str, Any]) -> ToolCall:
        """Read a ``tool_calls`` entry (with or without the ``function`` wrapper;
        arguments as an object or a JSON string).

        Raises:
            ValueError: The entry has no name or its arguments are not an object.
        """
        function = entry.get("function", entry)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool call entry without a name: {entry!r}")
        arguments, error = _decode_arguments(function.get("arguments", {}))
        if error:
            raise ValueError(f"tool call {name!r}: {error}")
        return cls(name, arguments)


@dataclass(frozen=True)
class ParsedTurn:
    """What one sampled assistant turn asks for.

    Attributes:
        content: Text outside tool calls, stripped.
        calls: Well-formed calls, in order.
        errors: One short model-facing message per malformed call; the agent sends
            them back to the model like tool outputs.
        final: The turn ends the trajectory (it attempted no call).
        answer: The final answer text when ``final`` (None: ended without an answer).
    """

    content: str
    calls: list[ToolCall]
    errors: list[str]
    final: bool
    answer: str | None = None


class ToolCallParser(Protocol):
    """A tool-call format: parse sampled text, render a call for demonstrations."""

    name: str
    stop_strings: tuple[str, ...]
    """Strings that end a turn besides the template's end-of-turn token."""

    def parse(self, text: str) -> ParsedTurn:
        """Parse one decoded assistant turn; never raises on model output."""
        ...

    def render_call(self, call: ToolCall) -> str:
        """The text a model should emit for ``call``."""
        ...


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# Error texts are read by the model, so they stay short and point at the fix.
_MAX_ERROR_DETAIL_CHARS = 80


class HermesParser:
    """Hermes / Qwen JSON calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    Any number of calls per turn. A turn without ``<tool_call>`` is final and its
    content (after a leading ``<think>...</think>`` block) is the answer. A stray
    ``</tool_call>`` without an opening tag is left in the content.
    """

    name = "hermes"
    # Several calls may follow each other, so the turn ends only at end-of-turn.
    stop_strings: tuple[str, ...] = ()

    def parse(self, text: str) -> ParsedTurn:
        """Split ``text`` into calls, errors, content and the final answer."""
        calls: list[ToolCall] = []
        errors: list[str] = []
        outside: list[str] = []
        position, index = 0, 0
        for match in _TOOL_CALL_RE.finditer(text):
            index += 1
            outside.append(text[position:match.start()])
            position = match.end()
            call, error = _read_hermes_call(match.group(1), index)
            if call is not None:
                calls.append(call)
            else:
                errors.append(error)
        rest = text[position:]
        unclosed = rest.find(TOOL_CALL_OPEN)
        if unclosed >= 0:
            # Only the last block can lack its closing tag: the turn was cut short.
            index += 1
            errors.append(f"tool call {index} is not closed: end it with {TOOL_CALL_CLOSE}")
            rest = rest[:unclosed]
        outside.append(rest)
        content = "".join(outside).strip()
        if index:
            return ParsedTurn(content, calls, errors, final=False)
        return ParsedTurn(content, [], [], final=True, answer=_answer_of(content))

    def render_call(self, call: ToolCall) -> str:
        """Qwen's rendering: tags on their own lines, compact-spaced JSON."""
        body = json.dumps({"name": call.name, "arguments": call.arguments},
                          ensure_ascii=False)
        return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _read_hermes_call(body: str, index: int) -> tuple[ToolCall | None, str]:
    """One ``<tool_call>`` body -> (call, "") or (None, model-facing error)."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"bad json in tool call {index}: {_short(exc.msg)} at char {exc.pos}"
    if not isinstance(payload, dict):
        return None, f"tool call {index} must be a JSON object with name and arguments"
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f"tool call {index} without a name"
    # A missing "arguments" is a call of a tool that takes none.
    arguments, error = _decode_arguments(payload.get("arguments", {}))
    if error:
        return None, f"tool call {index} ({_short(name)}): {error}"
    return ToolCall(name.strip(), arguments), ""


def _decode_arguments(raw: Any) -> tuple[dict[str, Any], str]:
    """Arguments as an object, or a JSON string of one (some models double-encode)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            return {}, f"bad json in arguments string: {_short(exc.msg)}"
    if not isinstance(raw, dict):
        return {}, f"arguments must be a JSON object, got {type(raw).__name__}"
    return raw, ""


def _answer_of(content: str) -> str | None:
    """The answer text of a final turn: content after a leading think block."""
    if content.startswith(THINK_OPEN):
        end = content.find(THINK_CLOSE)
        if end < 0:
            return None  # cut while thinking: no answer was given
        content = content[end + len(THINK_CLOSE):].strip()
    return content or None


def _short(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_DETAIL_CHARS else text[:_MAX_ERROR_DETAIL_CHARS] + "..."


class ArithParser:
    """The tiny model's tags: ``<calc>EXPR</calc>`` calls the calculator, ``<ans>X</ans>``
    answers. The first complete tag pair wins, exactly as :func:`arith.parse_action`;
    a turn with neither is final without an answer."""

    name = "arith"
    stop_strings: tuple[str, ...] = arith.STOP_STRINGS

    def parse(self, text: str) -> ParsedTurn:
        """Map :func:`arith.parse_action` onto a :class:`ParsedTurn`."""
        action = arith.parse_action(text)
        content = _strip_first_action(text)
        if action.kind is arith.ActionKind.TOOL_CALL:
            call = ToolCall(arith.TOOL_NAME, {"expression": action.argument})
            return ParsedTurn(content, [call], [], final=False)
        if action.kind is arith.ActionKind.ANSWER:
            return ParsedTurn(content, [], [], final=True, answer=action.argument)
        return ParsedTurn(content, [], [], final=True, answer=None)

    def render_call(self, call: ToolCall) -> str:
        """``<calc>EXPR</calc>``; only the calculator speaks this format.

        Raises:
            ValueError: Another tool, or no ``expression`` argument.
        """
        expression = call.arguments.get("expression")
        if call.name != arith.TOOL_NAME or not isinstance(expression, str):
            raise ValueError(f"the arith format renders only {arith.TOOL_NAME}"
                             f"(expression=str) calls, got {call!r}")
        return f"{arith.CALC_OPEN}{expression}{arith.CALC_CLOSE}"


# The pattern of arith.parse_action (first complete pair wins); a test keeps them equal.
_ARITH_ACTION_RE = re.compile(
    f"{re.escape(arith.CALC_OPEN)}(.*?){re.escape(arith.CALC_CLOSE)}"
    f"|{re.escape(arith.ANS_OPEN)}(.*?){re.escape(arith.ANS_CLOSE)}", re.DOTALL)


def _strip_first_action(text: str) -> str:
    match = _ARITH_ACTION_RE.search(text)
    if match is None:
        return text.strip()
    return (text[:match.start()] + text[match.end():]).strip()


PARSERS: dict[str, ToolCallParser] = {
    HermesParser.name: HermesParser(),
    ArithParser.name: ArithParser(),
}


def get_parser(name: str) -> ToolCallParser:
    """The registered parser called ``name``.

    Raises:
        ValueError: Unknown name; the message lists the known ones.
    """
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r} "
                         f"(known: {', '.join(sorted(PARSERS))})") from None
