"""Held-out evaluation during training: when rounds run and what a round records (pure).

A job with ``task.eval_interval`` > 0 runs eval rounds on the held-out split
(docs/datasets.md, docs/report.md). Round ``r`` (1-based; ``Trajectory.eval_round``,
0 on every training trajectory) evaluates the policy after ``eval_steps(...)[r - 1]``
training steps: before training (step 0), every ``eval_interval`` steps, and after the
last step. The scheduler admits a round once the job's step reaches it (a round already
overtaken by a later one is skipped, never run twice); the trainer aggregates the
round's trajectories into an :class:`EvalRecord` once all of them are in.

Every round evaluates the same prompts - the first ``eval_max_prompts`` renderable rows
of the held-out split in position order - so rounds are comparable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from libra import types as t
from libra.data.rows import DatasetRow, RowError

if TYPE_CHECKING:
    from libra.data.dataset import DatasetSplit

# Counter (the job's counters hash) of the last eval round the scheduler admitted.
EVAL_ROUNDS_COUNTER = "eval_rounds"
# Counters of eval trajectories, kept apart from the training accounting identity
# (produced == trained + dropped_stale + dropped_failed + in_flight_at_end).
EVAL_PRODUCED, EVAL_FAILED, EVAL_CONSUMED = "eval_produced", "eval_failed", "eval_consumed"
# Kind of the job event that carries one round's record (JSON under ``record``).
EVAL_EVENT = "eval"


def eval_size_counter(eval_round: int) -> str:
    """Counter holding how many trajectories round ``eval_round`` was admitted with:
    written by the scheduler in the transaction that admits the round, so the trainer
    knows when the round is complete."""
    return f"eval_size:{eval_round}"


def eval_consumed_counter(eval_round: int) -> str:
    """Counter of round ``eval_round``'s trajectories the trainer has consumed: kept in
    Redis with the acks, so a restarted trainer knows which rounds are already in."""
    return f"eval_consumed:{eval_round}"


def eval_steps(num_steps: int, eval_interval: int) -> list[int]:
    """The training step after which each round runs (round r at index r - 1): 0, every
    ``eval_interval`` steps, and ``num_steps``; [] when eval is off."""
    if eval_interval <= 0:
        return []
    return sorted({*range(0, num_steps + 1, eval_interval), num_steps})


def due_round(steps: Sequence[int], last_admitted: int, step: int) -> int:
    """The round to admit at job step ``step`` (0: none): the latest round due that is
    newer than ``last_admitted``. Rounds overtaken by a later due one are skipped, so a
    lagging scheduler never evaluates one policy twice."""
    due = sum(1 for s in steps if s <= step)
    return due if due > last_admitted else 0


def eval_rows(split: DatasetSplit | None, max_prompts: int) -> list[DatasetRow]:
    """The prompts every round evaluates: the first ``max_prompts`` rows of the held-out
    split that render (an unrenderable row is left out, as training skips it)."""
    rows: list[DatasetRow] = []
    for position in range(len(split) if split is not None else 0):
        if len(rows) >= max_prompts:
            break
        try:
            rows.append(split.row(position))  # type: ignore[union-attr]
        except RowError:
            continue
    return rows


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """The unbiased pass@k estimator of one prompt: ``1 - C(n-c, k) / C(n, k)``
    (Chen et al. 2021), the chance that k of the n samples drawn without replacement
    contain a correct one."""
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k} n={num_samples}")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def pass_at_k_values(samples_per_prompt: int) -> list[int]:
    """The k reported: 1, the powers of two below n, and n itself."""
    ks = {1, samples_per_prompt}
    k = 2
    while k < samples_per_prompt:
        ks.add(k)
        k *= 2
    return sorted(ks)


@dataclass(frozen=True, slots=True)
class EvalRecord:
    """One eval round as report.json's ``eval`` list holds it (docs/report.md)."""

    eval_round: int
    step: int
    """Training steps taken before the round (0: the policy before training)."""
    policy_version_min: int
    policy_version_max: int
    """Versions that generated the round's tokens (they differ when weights were
    published while it ran; -1 when nothing was generated)."""
    reward_mean: float
    accuracy: float
    """Share of samples with reward >= ``task.eval_correct_reward``."""
    pass_at_k: dict[str, float]
    turns_mean: float
    tool_error_rate: float
    """Share of tool returns that did not succeed (failure or timeout)."""
    num_tool_calls: int
    num_prompts: int
    num_samples: int
    num_failed: int
    num_expected: int
    is_complete: bool
    duration_s: float
    """From the round's first trajectory created to its last one finished."""

    def to_json(self) -> str:
        """The record as sorted JSON (the form stored in Redis and report.json)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EvalRecord:
        """Read a record written by :meth:`to_json`."""
        return cls(**json.loads(text))


def aggregate_round(eval_round: int, step: int, trajs: Sequence[t.Trajectory], *,
                    num_expected: int, correct_reward: float) -> EvalRecord:
    """The record of one round from its trajectories.

    A failed sample counts as reward 0 and incorrect (it was attempted: leaving it out
    would flatter the policy); ``num_failed`` says how many there were. pass@k is the
    mean over prompts of the unbiased estimator, for the k of :func:`pass_at_k_values`
    up to the smallest number of samples any prompt has.
    """
    rewards = [tr.reward if tr.status is t.TrajectoryStatus.FINISHED else 0.0 for tr in trajs]
    correct = [r >= correct_reward for r in rewards]
    by_prompt: dict[str, list[bool]] = {}
    for tr, ok in zip(trajs, correct, strict=True):
        by_prompt.setdefault(tr.group_id, []).append(ok)
    n_min = min((len(v) for v in by_prompt.values()), default=0)
    pass_k = {str(k): _mean([pass_at_k(len(v), sum(v), k) for v in by_prompt.values()])
              for k in (pass_at_k_values(n_min) if n_min else [])}
    states = [s for tr in trajs for s in tr.tool_states]
    versions = [v for tr in trajs for v, m in zip(tr.token_versions, tr.loss_mask,
                                                  strict=False) if m]
    created = [tr.created_at_ms for tr in trajs if tr.created_at_ms]
    finished = [tr.finished_at_ms for tr in trajs if tr.finished_at_ms]
    return EvalRecord(
        eval_round=eval_round, step=step,
        policy_version_min=min(versions, default=-1),
        policy_version_max=max(versions, default=-1),
        reward_mean=round(_mean(rewards), 6),
        accuracy=round(_mean([float(c) for c in correct]), 6),
        pass_at_k={k: round(v, 6) for k, v in pass_k.items()},
        turns_mean=round(_mean([float(tr.num_turns) for tr in trajs]), 4),
        tool_error_rate=round(_mean([float(s.status is not t.ToolStatus.SUCCESS)
                                     for s in states]), 6),
        num_tool_calls=len(states), num_prompts=len(by_prompt), num_samples=len(trajs),
        num_failed=sum(tr.status is not t.TrajectoryStatus.FINISHED for tr in trajs),
        num_expected=num_expected, is_complete=len(trajs) >= num_expected,
        duration_s=round((max(finished) - min(created)) / 1000, 3)
        if created and finished else 0.0)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
