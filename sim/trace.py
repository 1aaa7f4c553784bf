"""Workload traces: one trajectory per JSONL line (format in ``docs/simulator.md``).

    {"prompt_id": str, "step": int, "prompt_tokens": int,
     "turns": [{"output_tokens": int,
                "tool": {"type": str, "payload_tokens": int,
                         "status": "success|failure|timeout", "latency_s": float}}]}

Every turn but the last has a ``tool``; the last has none. Optional keys:
``trajectory_id`` (default ``"<line>"``), ``group_id`` (default ``"<step>:<prompt_id>"``).
A malformed line raises ``TraceError`` naming the line number and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUSES = ("success", "failure", "timeout")


class TraceError(ValueError):
    """A malformed trace line."""

    def __init__(self, line_no: int, field: str, message: str) -> None:
        super().__init__(f"trace line {line_no}: field {field!r}: {message}")
        self.line_no = line_no
        self.field = field


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The tool call that ends a turn."""

    type: str
    payload_tokens: int
    status: str
    latency_s: float


@dataclass(frozen=True, slots=True)
class Turn:
    """One generation request and the tool call after it (``None`` on the last turn)."""

    output_tokens: int
    tool: ToolCall | None = None


@dataclass(frozen=True, slots=True)
class TraceTrajectory:
    """One trajectory of the trace."""

    trajectory_id: str
    prompt_id: str
    group_id: str
    step: int
    prompt_tokens: int
    turns: tuple[Turn, ...]

    @property
    def post_prompt_tokens(self) -> int:
        """Model output plus tool payload tokens."""
        return sum(t.output_tokens + (t.tool.payload_tokens if t.tool else 0) for t in self.turns)

    @property
    def total_tokens(self) -> int:
        """Prompt plus post-prompt tokens: the final context length."""
        return self.prompt_tokens + self.post_prompt_tokens

    @property
    def output_tokens(self) -> int:
        """Model-generated tokens."""
        return sum(t.output_tokens for t in self.turns)

    @property
    def tool_s(self) -> float:
        """Summed tool latency."""
        return sum(t.tool.latency_s for t in self.turns if t.tool)

    def to_dict(self) -> dict[str, Any]:
        """The JSONL object."""
        turns = []
        for t in self.turns:
            row: dict[str, Any] = {"output_tokens": t.output_tokens}
            if t.tool is not None:
                row["tool"] = {
                    "type": t.tool.type,
                    "payload_tokens": t.tool.payload_tokens,
                    "status": t.tool.status,
                    "latency_s": t.tool.latency_s,
                }
            turns.append(row)
        return {
            "trajectory_id": self.trajectory_id,
            "prompt_id": self.prompt_id,
            "group_id": self.group_id,
            "step": self.step,
            "prompt_tokens": self.prompt_tokens,
            "turns": turns,
        }


def _int(obj: dict, key: str, line_no: int, prefix: str = "", minimum: int = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(line_no, prefix + key, f"expected an integer, got {value!r}")
    if value < minimum:
        raise TraceError(line_no, prefix + key, f"must be >= {minimum}, got {value}")
    return value


def _tool(obj: Any, line_no: int, prefix: str) -> ToolCall:
    if not isinstance(obj, dict):
        raise TraceError(line_no, prefix[:-1], f"expected an object, got {obj!r}")
    ttype = obj.get("type")
    if not isinstance(ttype, str) or not ttype:
        raise TraceError(line_no, prefix + "type", f"expected a non-empty string, got {ttype!r}")
    status = obj.get("status")
    if status not in STATUSES:
        raise TraceError(
            line_no, prefix + "status", f"expected one of {'|'.join(STATUSES)}, got {status!r}"
        )
    latency = obj.get("latency_s")
    if isinstance(latency, bool) or not isinstance(latency, int | float) or latency < 0:
        raise TraceError(line_no, prefix + "latency_s", f"expected a number >= 0, got {latency!r}")
    return ToolCall(ttype, _int(obj, "payload_tokens", line_no, prefix), status, float(latency))


def parse_line(text: str, line_no: int) -> TraceTrajectory:
    """Parse one JSONL line. Raises ``TraceError``."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            line_no, "<json>", f"not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(obj, dict):
        raise TraceError(line_no, "<json>", "expected a JSON object")
    prompt_id = obj.get("prompt_id")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise TraceError(line_no, "prompt_id", f"expected a non-empty string, got {prompt_id!r}")
    step = _int(obj, "step", line_no)
    prompt_tokens = _int(obj, "prompt_tokens", line_no, minimum=1)
    raw_turns = obj.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise TraceError(line_no, "turns", "expected a non-empty list")
    turns = []
    for i, raw in enumerate(raw_turns):
        prefix = f"turns[{i}]."
        if not isinstance(raw, dict):
            raise TraceError(line_no, f"turns[{i}]", f"expected an object, got {raw!r}")
        out = _int(raw, "output_tokens", line_no, prefix, minimum=1)
        last = i == len(raw_turns) - 1
        if last and raw.get("tool") is not None:
            raise TraceError(line_no, prefix + "tool", "the last turn must not call a tool")
        if not last and raw.get("tool") is None:
            raise TraceError(line_no, prefix + "tool", "every turn but the last must call a tool")
        turns.append(Turn(out, None if last else _tool(raw["tool"], line_no, prefix + "tool.")))
    return TraceTrajectory(
        trajectory_id=str(obj.get("trajectory_id", line_no)),
        prompt_id=prompt_id,
        group_id=str(obj.get("group_id", f"{step}:{prompt_id}")),
        step=step,
        prompt_tokens=prompt_tokens,
        turns=tuple(turns),
    )


def parse_lines(lines: Iterable[str]) -> Iterator[TraceTrajectory]:
    """Parse JSONL text lines (1-based numbering; blank lines skipped)."""
    for line_no, text in enumerate(lines, start=1):
        if text.strip():
            yield parse_line(text, line_no)


def load(path: str | Path) -> list[TraceTrajectory]:
    """Read a whole trace file. Raises ``TraceError`` or ``OSError``."""
    with open(path) as fh:
        trace = list(parse_lines(fh))
    if not trace:
        raise TraceError(0, "<file>", f"{path} holds no trajectories")
    return trace


def dump(trace: Iterable[TraceTrajectory], path: str | Path) -> None:
    """Write a trace as JSONL."""
    with open(path, "w") as fh:
        for traj in trace:
            fh.write(json.dumps(traj.to_dict(), separators=(",", ":")) + "\n")
