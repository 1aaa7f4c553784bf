"""Task definitions: prompts, the agent protocol, tool semantics and rewards (pure Python).

``TASKS`` is the registry of built-in prompt sets: each is a kind of dataset in
``libra.data.DATASET_KINDS`` (``[task] kind`` or the older ``name``), which is how every
service gets a job's prompts; :func:`load_problems` generates one set directly.
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
    """The problems of task ``name`` (equal arguments give equal lists on every host);
    services read prompts through ``libra.data.open_job_dataset`` instead."""
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
