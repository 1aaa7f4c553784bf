"""Search over train/rollout splits and rollout layouts (design digest 5.3).

Two levels: for every whole-node split, the best rollout layout for the remaining
nodes is chosen among uniform node patterns and two-pattern mixes (quarters), with
the closed-form makespan; the few best plans overall are then re-scored with the
greedy longest-first assignment. Objective: ``max(T_train, T_rollout)`` with both
times multiplied by their calibration factors.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from services.coordinator.planner.costmodel import (
    RequestStats,
    RolloutCostModel,
    TrainParallelism,
    train_memory_fits,
    train_step_s,
)
from services.coordinator.planner.plan import ClusterShape, NodePattern, Plan
from services.coordinator.planner.specs import HardwareSpec, ModelSpec

MIX_FRACTIONS = (0.25, 0.5, 0.75)
REFINE_TOP_K = 3
MAX_REFINE_REQUESTS = 2048


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    """What the search may choose."""

    node_patterns: tuple[NodePattern, ...] = ((1, 1, 2, 4), (2, 2, 2, 2), (4, 4), (8,), (2, 2, 4))
    train_tp: int = 8
    train_pp: int = 1
    min_train_nodes: int = 1
    min_rollout_nodes: int = 1
    require_heterogeneous: bool = False
    """Keep only layouts with at least two distinct TP degrees (reference 48-GPU arms)."""
    fixed_train_nodes: int | None = None
    """Pin the split (static systems search only the layout)."""


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
        mean = sum(r.prompt_tokens + r.gen_tokens for r in self.history) / len(self.history)
        return mean * self.requests_per_step

    @functools.cached_property
    def mean_seq_tokens(self) -> float:
        """Mean sequence length."""
        return sum(r.prompt_tokens + r.gen_tokens for r in self.history) / len(self.history)


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


class PlanSearch:
    """Scores and searches plans for one cluster.

    Args:
        hw: Device.
        model: Model.
        cluster: Node count and devices per node.
        space: Search space.
    """

    def __init__(
        self, hw: HardwareSpec, model: ModelSpec, cluster: ClusterShape, space: SearchSpace
    ) -> None:
        self.hw, self.model, self.cluster, self.space = hw, model, cluster, space
        for pattern in space.node_patterns:
            if sum(pattern) != cluster.gpus_per_node:
                raise ValueError(
                    f"node_patterns: {list(pattern)} does not fill {cluster.gpus_per_node} devices"
                )

    def train_parallelism(self, train_nodes: int) -> TrainParallelism:
        """TP x PP per replica, DP over the rest of the training nodes."""
        replica = self.space.train_tp * self.space.train_pp
        return TrainParallelism(
            self.space.train_tp,
            self.space.train_pp,
            max(0, train_nodes * self.cluster.gpus_per_node // replica),
        )

    def train_s(self, par: TrainParallelism, work: Workload, extra_gpus: int = 0) -> float:
        """Predicted step time (``extra_gpus``: hybrid replicas adding DP width)."""
        replica = par.tp * par.pp
        widened = TrainParallelism(par.tp, par.pp, par.dp + extra_gpus // replica, par.micro_batch)
        if not train_memory_fits(self.hw, self.model, widened, int(work.mean_seq_tokens)):
            return math.inf
        return train_step_s(
            self.hw, self.model, widened, work.tokens_per_step, work.mean_seq_tokens
        )

    def rollout_s(self, model: RolloutCostModel, plan: Plan, work: Workload, greedy: bool) -> float:
        """Predicted rollout makespan of one step on ``plan``."""
        if greedy:
            reqs = _scaled(work.history, min(work.requests_per_step, MAX_REFINE_REQUESTS))
            scale = work.requests_per_step / len(reqs)
            # Greedy runs on at most MAX_REFINE_REQUESTS; past that, work grows linearly
            # (an over-estimate of the critical-path part, which does not grow).
            return model.makespan_s(plan.rollout_tps, reqs, work.pipeline_depth) * max(1.0, scale)
        counts = Counter(plan.rollout_tps)
        return model.fast_makespan_s(
            dict(counts), work.requests_per_step / len(work.history), work.pipeline_depth
        )

    def score(
        self,
        plan: Plan,
        work: Workload,
        train_factor: float = 1.0,
        rollout_factor: float = 1.0,
        greedy: bool = True,
    ) -> Scored:
        """Calibrated times of ``plan``."""
        model = RolloutCostModel(self.hw, self.model, work.history)
        return Scored(
            plan,
            self.train_s(plan.train, work) * train_factor,
            self.rollout_s(model, plan, work, greedy) * rollout_factor,
        )

    def layouts(self, num_nodes: int) -> list[tuple[tuple[NodePattern, int], ...]]:
        """Uniform layouts and two-pattern mixes in quarters, as (pattern, node count) pairs."""
        pats = self.space.node_patterns
        out: set[tuple[tuple[NodePattern, int], ...]] = {((p, num_nodes),) for p in pats}
        for a, b in itertools.combinations(pats, 2):
            for frac in MIX_FRACTIONS:
                na = int(round(num_nodes * frac))
                if 0 < na < num_nodes:
                    out.add(((a, na), (b, num_nodes - na)))
        if self.space.require_heterogeneous:
            out = {lay for lay in out if len({tp for p, _ in lay for tp in p}) >= 2}
        return sorted(out)

    def search(
        self, work: Workload, train_factor: float = 1.0, rollout_factor: float = 1.0
    ) -> Scored | None:
        """Best plan, or ``None`` when nothing is feasible."""
        model = RolloutCostModel(self.hw, self.model, work.history)
        scale = work.requests_per_step / len(work.history)
        best_layout: dict[int, tuple[float, tuple[NodePattern, ...]]] = {}
        candidates: list[Scored] = []
        for train_nodes in self._train_node_options():
            rollout_nodes = self.cluster.num_nodes - train_nodes
            par = self.train_parallelism(train_nodes)
            t_train = self.train_s(par, work) * train_factor
            if math.isinf(t_train):
                continue
            if rollout_nodes not in best_layout:
                best_layout[rollout_nodes] = self._best_layout(
                    model, rollout_nodes, scale, work.pipeline_depth
                )
            t_roll, layout = best_layout[rollout_nodes]
            if layout:
                nodes = tuple(p for p, n in layout for _ in range(n))
                candidates.append(Scored(Plan(par, nodes), t_train, t_roll * rollout_factor))
        candidates.sort(key=lambda s: s.objective_s)
        refined = [
            Scored(
                s.plan, s.train_s, self.rollout_s(model, s.plan, work, greedy=True) * rollout_factor
            )
            for s in candidates[:REFINE_TOP_K]
        ]
        refined = [s for s in refined if not math.isinf(s.objective_s)]
        return min(refined, key=lambda s: s.objective_s, default=None)

    def _train_node_options(self) -> range:
        sp = self.space
        if sp.fixed_train_nodes is not None:
            return range(sp.fixed_train_nodes, sp.fixed_train_nodes + 1)
        return range(sp.min_train_nodes, self.cluster.num_nodes - sp.min_rollout_nodes + 1)

    def _best_layout(
        self, model: RolloutCostModel, num_nodes: int, scale: float, depth: int
    ) -> tuple[float, tuple]:
        best: tuple[float, tuple] = (math.inf, ())
        for layout in self.layouts(num_nodes):
            counts: dict[int, int] = {}
            for pattern, n in layout:
                for tp in pattern:
                    counts[tp] = counts.get(tp, 0) + n
            t = model.fast_makespan_s(counts, scale, depth)
            if t < best[0]:
                best = (t, layout)
        return best


def _scaled(history: Sequence[RequestStats], n: int) -> list[RequestStats]:
    """``n`` requests drawn evenly (deterministically) from the history."""
    if n >= len(history):
        reps = -(-n // len(history))
        return (list(history) * reps)[:n]
    stride = len(history) / n
    return [history[int(i * stride)] for i in range(n)]
