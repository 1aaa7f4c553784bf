"""The search's value types: the workload a plan serves, a scored plan, the refiner.

Apart from ``search.py`` so the candidate-set module (``candidates.py``) can name them
without importing the search that uses it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

from scheduling.planner.costmodel import RequestStats
from scheduling.planner.plan import Plan


@dataclass(frozen=True)
class Workload:
    """Per-step demand the plan must serve."""

    requests_per_step: int
    history: tuple[RequestStats, ...]
    pipeline_depth: int = 1
    """Rollout steps in flight at once (async: staleness bound + 1; sync: 1)."""

    @functools.cached_property
    def tokens_per_step(self) -> float:
        """Prompt plus post-prompt tokens of one step's batch."""
        return self.mean_seq_tokens * self.requests_per_step

    @functools.cached_property
    def mean_seq_tokens(self) -> float:
        """Mean sequence length."""
        return sum(r.prompt_tokens + r.gen_tokens for r in self.history) / len(self.history)


class RolloutRefiner(Protocol):
    """A slower, truer rollout score for the few plans the closed form ranks best (the
    simulator's twin, ``sim/twin.py``): the step time ``plan`` would run at.

    Optional: ``workers`` (int) and ``rollout_s_many(plans, work)`` (the scores of a
    batch at once); ``PlanSearch.search`` then refines in waves of that width."""

    def rollout_s(self, plan: Plan, work: Workload) -> float:
        """Seconds of rollout per step that ``plan`` would take on ``work``."""
        ...


@dataclass(frozen=True, slots=True)
class Scored:
    """A plan with its (calibrated) predicted stage times."""

    plan: Plan
    train_s: float
    rollout_s: float

    @property
    def objective_s(self) -> float:
        """``max(T_train, T_rollout)``."""
        return max(self.train_s, self.rollout_s)

