"""Eval rounds as the scheduler admits them (pure; libra/evaluation.py has the rules).

A round is one group per held-out prompt with ``task.eval_samples_per_prompt`` samples,
tagged with ``eval_round``: it is placed like training work (same policy, instances,
tools and reward) but is not counted against the staleness budget - it is bounded by
``task.eval_max_prompts`` and admitted at most once per round.
"""

from __future__ import annotations

from collections.abc import Sequence

from libra import types as t
from libra.data import DatasetRow
from libra.evaluation import EVAL_ROUNDS_COUNTER, due_round
from libra.ids import eval_group_id, trajectory_id
from libra.jobspec import JobSpec


def round_to_admit(steps: Sequence[int], counters: dict[str, int],
                   step: int) -> int:
    """The eval round due at job ``step`` and not admitted yet (0: none)."""
    if not steps:
        return 0
    return due_round(steps, counters.get(EVAL_ROUNDS_COUNTER, 0), step)


def make_eval_round(job_id: str, spec: JobSpec, eval_round: int, rows: Sequence[DatasetRow],
                    now_ms: int) -> list[t.Trajectory]:
    """The trajectories of round ``eval_round``: every eval row, k samples each."""
    trajs = []
    for index, row in enumerate(rows):
        gid = eval_group_id(job_id, eval_round, index, row.prompt_id)
        trajs += [t.Trajectory(
            trajectory_id=trajectory_id(gid, sample), job_id=t.JobId(job_id), group_id=gid,
            prompt_id=row.prompt_id, prompt_text=row.prompt_text, reference=row.reference,
            prompt_messages_json=row.prompt_messages_json, created_at_ms=now_ms,
            eval_round=eval_round)
            for sample in range(spec.task.eval_samples_per_prompt)]
    return trajs
