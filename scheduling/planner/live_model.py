"""The live planner's deployment model: the worker pool by role, and the two-number
cost model and split search fitted to a running job's measured steps (pure).

See ``live.py`` for how ``LivePlanner`` drives them and ``docs/planner.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduling.planner.costmodel import TrainParallelism
from scheduling.planner.plan import ClusterShape, Plan, PlanError
from scheduling.planner.search import Scored, Workload

ROLES = (
    "core-rollout",
    "core-training",
    "hybrid-rollout",
    "hybrid-joining",
    "hybrid-training",
    "service",
)


@dataclass(frozen=True, slots=True)
class Pool:
    """Leased workers by role (``service`` excluded from ``size``)."""

    core_training: int
    core_rollout: int
    hybrid_rollout: int
    hybrid_joining: int
    hybrid_training: int

    @property
    def size(self) -> int:
        """Workers the planner divides."""
        return (self.core_training + self.core_rollout + self.hybrid_rollout
                + self.hybrid_joining + self.hybrid_training)

    @property
    def lent(self) -> int:
        """Hybrids on the training side (joining or training)."""
        return self.hybrid_joining + self.hybrid_training

    @property
    def train_workers(self) -> int:
        """Effective training side of the split."""
        return self.core_training + self.lent

    def capacity(self, reserve: int) -> int:
        """Hybrids that may be lent in all, keeping ``reserve`` (>= 1) rollout workers."""
        hybrids = self.hybrid_rollout + self.lent
        return max(0, min(hybrids, self.size - self.core_training - max(1, reserve)))

    def to_dict(self) -> dict[str, int]:
        """JSON-able counts."""
        return {
            "core_training": self.core_training, "core_rollout": self.core_rollout,
            "hybrid_rollout": self.hybrid_rollout, "hybrid_joining": self.hybrid_joining,
            "hybrid_training": self.hybrid_training,
        }


def count_roles(leases: Iterable[Any]) -> Pool:
    """Count leases (``libra.types.Lease``, or mappings with a ``role`` key) by role.

    Raises:
        PlanError: A lease without a known role (the message names its index).
    """
    counts = dict.fromkeys(ROLES, 0)
    for i, lease in enumerate(leases):
        role = lease.get("role") if isinstance(lease, Mapping) else getattr(lease, "role", None)
        role = getattr(role, "value", role)
        if role not in counts:
            raise PlanError(f"leases[{i}].role: unknown role {role!r}; known: {', '.join(ROLES)}")
        counts[role] += 1
    return Pool(counts["core-training"], counts["core-rollout"], counts["hybrid-rollout"],
                counts["hybrid-joining"], counts["hybrid-training"])


@dataclass(frozen=True, slots=True)
class LiveSignal:
    """Elastic signal as the coordinator's executor reads it (hybrid workers)."""

    action: str
    desired: int
    current: int
    reason: str
    ttl_step: int


class LiveCostModel:
    """``T_train(t) = w_train / t`` and ``T_rollout(r) = w_rollout / r``, fitted by EMA."""

    def __init__(self, alpha: float) -> None:
        self._alpha = alpha
        self.w_train: float | None = None
        self.w_rollout: float | None = None

    def observe(self, train_s: float, n_train: int, rollout_s: float, n_rollout: int) -> None:
        """Fold one step in (a side with no workers that step is skipped)."""
        if n_train > 0:
            self.w_train = self._ema(self.w_train, train_s * n_train)
        if n_rollout > 0:
            self.w_rollout = self._ema(self.w_rollout, rollout_s * n_rollout)

    def _ema(self, old: float | None, sample: float) -> float:
        return sample if old is None else (1 - self._alpha) * old + self._alpha * sample

    def times_s(self, train_workers: int, rollout_workers: int) -> tuple[float, float]:
        """Predicted (train, rollout) seconds per step for a split (inf for an empty side)."""
        train = (self.w_train or 0.0) / train_workers if train_workers > 0 else math.inf
        roll = (self.w_rollout or 0.0) / rollout_workers if rollout_workers > 0 else math.inf
        return train, roll


class LiveSearch:
    """The core's search protocol over one-worker devices: split only, no layouts."""

    def __init__(self, model: LiveCostModel, reserve: int) -> None:
        self.model = model
        self._reserve = reserve
        self.pool = Pool(1, 1, 0, 0, 0)
        self.cluster = ClusterShape(2, 1)

    def set_pool(self, pool: Pool) -> None:
        """Leases of this step (changes the cluster when workers come or go)."""
        self.pool = pool
        self.cluster = ClusterShape(max(1, pool.size), 1)

    def plan(self, train_workers: int) -> Plan:
        """``train_workers`` training, the rest rollout, one device each."""
        rollout = self.pool.size - train_workers
        return Plan(TrainParallelism(1, 1, train_workers), ((1,),) * max(0, rollout))

    def score(self, plan: Plan, work: Workload | None = None, train_factor: float = 1.0,
              rollout_factor: float = 1.0, greedy: bool = True) -> Scored:
        """Predicted times (the live model is already fitted: factors are ignored)."""
        return Scored(plan, *self.model.times_s(plan.train_gpus, plan.rollout_gpus))

    def prefetch(self, plans: Sequence[Plan], work: Workload | None = None) -> None:
        """Nothing to do: the live model scores a plan in microseconds."""

    def search(self, work: Workload | None = None, train_factor: float = 1.0,
               rollout_factor: float = 1.0, *, homogeneous_only: bool = False,
               prefetch: Sequence[Plan] = ()) -> Scored | None:
        """Best split from the core alone to every lendable hybrid; ties keep the current
        split, then prefer fewer training workers. (Workers are one device each, so
        every plan is homogeneous; there is no refiner to prefetch for.)"""
        pool = self.pool
        lo = pool.core_training
        hi = lo + pool.capacity(self._reserve)
        options = [self.score(self.plan(t)) for t in range(lo, hi + 1)]
        if not options:
            return None
        return min(options, key=lambda s: (s.objective_s, s.plan.train_gpus != pool.train_workers,
                                           s.plan.train_gpus))

    def train_s(self, par: TrainParallelism, work: Workload | None = None,
                extra_gpus: int = 0) -> float:
        """Predicted step time with ``extra_gpus`` more training workers."""
        return self.model.times_s(par.num_gpus + extra_gpus, 1)[0]
