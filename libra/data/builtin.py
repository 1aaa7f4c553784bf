"""The built-in prompt sets (``libra.tasks.TASKS``) as row sources (pure Python).

A built-in task is generated from ``(task.seed, task.num_prompts)``, the same list on
every host; its rows keep the prompt ids, texts and references the scheduler always
used (``reference`` is the integer answer as text).
"""

from __future__ import annotations

from collections.abc import Sequence

from libra.data.rows import DatasetRow
from libra.tasks import TASKS, Problem


class BuiltinSource:
    """The problems of one built-in task, by index."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)

    @classmethod
    def generate(cls, name: str, seed: int, num_prompts: int) -> BuiltinSource:
        """Task ``name`` of ``TASKS`` (raises KeyError for an unknown name)."""
        return cls(TASKS[name](seed, num_prompts))

    def __len__(self) -> int:
        return len(self.problems)

    def row(self, index: int) -> DatasetRow:
        """Row ``index`` of the generated problems as a dataset row (prompt, reference answer)."""
        problem = self.problems[int(index)]
        return DatasetRow(prompt_id=problem.prompt_id, prompt_text=problem.prompt,
                          reference=str(problem.answer))
