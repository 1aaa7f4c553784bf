"""Task definitions: prompts, the agent protocol, tool semantics and rewards (pure Python)."""

from libra.tasks.arith import (
    STOP_STRINGS,
    Action,
    ActionKind,
    ArithDataset,
    Problem,
    Segment,
    calculate,
    demonstration,
    format_tool_output,
    parse_action,
    reward,
)

__all__ = [
    "STOP_STRINGS",
    "Action",
    "ActionKind",
    "ArithDataset",
    "Problem",
    "Segment",
    "calculate",
    "demonstration",
    "format_tool_output",
    "parse_action",
    "reward",
]
