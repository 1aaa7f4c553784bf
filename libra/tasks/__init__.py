"""Task definitions: prompts, the agent protocol, tool semantics and rewards (pure Python).

``TASKS`` is the registry of built-in prompt sets (the job spec's ``task.name`` is
validated against it); :func:`load_problems` is how every service gets a job's prompts.
"""

from collections.abc import Callable, Sequence

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
from libra.tasks.calc_words import DEFAULT_SYSTEM_PROMPT as CALC_WORDS_SYSTEM_PROMPT
from libra.tasks.calc_words import calc_words_problems, chat_demonstration

TASKS: dict[str, Callable[[int, int], Sequence[Problem]]] = {
    "arith": ArithDataset,
    "calc-words": calc_words_problems,
}

# The system message of chat models when the spec sets none.
TASK_SYSTEM_PROMPTS: dict[str, str] = {"calc-words": CALC_WORDS_SYSTEM_PROMPT}


def load_problems(name: str, seed: int, num_prompts: int) -> list[Problem]:
    """The prompts of task ``name`` (equal arguments give equal lists on every host)."""
    return list(TASKS[name](seed, num_prompts))


__all__ = [
    "TASKS",
    "TASK_SYSTEM_PROMPTS",
    "calc_words_problems",
    "chat_demonstration",
    "load_problems",
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
