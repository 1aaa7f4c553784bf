"""Search over train/rollout splits and rollout layouts (design digest 5.3).

Two levels: for every whole-node split, the best rollout layout for the remaining
nodes is chosen among uniform node patterns and two-pattern mixes (quarters), with
the closed-form makespan; the few best plans overall are then re-scored with the
greedy longest-first assignment. Objective: ``max(T_train, T_rollout)`` with both
times multiplied by their calibration factors.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.planner import candidates as cands
from scheduling.planner.costmodel import (
    LayoutCounts,
    RequestStats,
    RolloutCostModel,
    TrainParallelism,
    train_memory_fits,
    train_step_s,
)
from scheduling.planner.plan import ClusterShape, NodePattern, Plan, PlanError
from scheduling.planner.scored import RolloutRefiner, Scored, Workload
from scheduling.planner.specs import HardwareSpec, ModelSpec

__all__ = ["PlanSearch", "RolloutRefiner", "Scored", "SearchSpace", "Workload"]

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
    homogeneous_per_split: bool = True
    """With a refiner, also refine homogeneous layouts at each split the closed form
    ranks top (``scheduling.planner.candidates``; issue 20, session 14)."""
    homogeneous_screen: str = "front"
    """Which homogeneous layouts per top split: ``closed_form`` (its best one) or
    ``front`` (every one on the (work, straggler path) Pareto front; session 15)."""
    mix_refine_margin: float | None = 0.15
    """With a refiner, a heterogeneous candidate (a mix) is refined only when the closed
    form puts it ahead of every homogeneous candidate at its split by more than this
    fraction of their objective (none there, or ``require_heterogeneous``: refined).
    ``None``: every mix is refined, as before session 17. The default is the twin's
    +-15% agreement band: the closed form favours mixes (issue 20, session 15) and a
    lead inside the band is not one it resolves, while the mixes are the costliest twin
    runs (session 17, ``scheduling.planner.candidates.screen_mixes``)."""


class PlanSearch:
    """Scores and searches plans for one cluster.

    Args:
        hw: Device.
        model: Model.
        cluster: Node count and devices per node.
        space: Search space.
        refiner: Replaces the greedy re-score of the top candidates and of scored plans
            (``None``: the greedy longest-first assignment).
    """

    def __init__(
        self,
        hw: HardwareSpec,
        model: ModelSpec,
        cluster: ClusterShape,
        space: SearchSpace,
        refiner: RolloutRefiner | None = None,
    ) -> None:
        self.hw, self.model, self.cluster, self.space = hw, model, cluster, space
        self.refiner = refiner
        _check_space(space, cluster)
        if not self._train_node_options():
            raise PlanError(
                f"train_tp*train_pp: no allowed training node count holds whole "
                f"{space.train_tp * space.train_pp}-device replicas on {cluster.num_nodes} nodes"
            )
        self._layouts: dict[int, list[tuple[tuple[NodePattern, int], ...]]] = {}
        self._layout_counts: dict[int, list[LayoutCounts]] = {}
        self._cost_model: RolloutCostModel | None = None
        self.pruned = 0
        """Candidates not re-scored because their training time alone could not win."""

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
        if greedy and self.refiner is not None:
            return self.refiner.rollout_s(plan, work)
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
        model = self.cost_model(work)
        return Scored(
            plan,
            self.train_s(plan.train, work) * train_factor,
            self.rollout_s(model, plan, work, greedy) * rollout_factor,
        )

    def prefetch(self, plans: Sequence[Plan], work: Workload) -> None:
        """Refine ``plans`` at once on a batch refiner (one wave on its workers), for
        its cache, which ``score`` then reads; a no-op without one."""
        many = getattr(self.refiner, "rollout_s_many", None)
        if many is not None and len(plans) > 1:
            many(list(plans), work)

    def cost_model(self, work: Workload) -> RolloutCostModel:
        """Rollout cost model of ``work``'s history (reused while the history is the same)."""
        cached = self._cost_model
        if cached is None or cached.history is not work.history:
            cached = self._cost_model = RolloutCostModel(self.hw, self.model, work.history)
        return cached

    def layouts(self, num_nodes: int) -> list[tuple[tuple[NodePattern, int], ...]]:
        """Uniform layouts and two-pattern mixes in quarters, as (pattern, node count) pairs."""
        if num_nodes not in self._layouts:
            self._layouts[num_nodes] = self._enumerate_layouts(num_nodes)
        return self._layouts[num_nodes]

    def _enumerate_layouts(self, num_nodes: int) -> list[tuple[tuple[NodePattern, int], ...]]:
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
        self, work: Workload, train_factor: float = 1.0, rollout_factor: float = 1.0,
        *, homogeneous_only: bool = False, prefetch: Sequence[Plan] = (),
    ) -> Scored | None:
        """Best plan, or ``None`` when nothing is feasible.

        Closed-form scores for every split pick the ``REFINE_TOP_K`` best, which are
        re-scored with the greedy assignment. Splits are visited by rising training
        time; once a split's training time alone exceeds the K-th best objective so far,
        it and every later one cannot enter the top K and are skipped (exact pruning:
        the result equals the unpruned enumeration's). ``homogeneous_only``: only
        layouts of one TP degree (``candidates``). ``prefetch``: plans the caller scores
        next (the plan in force), refined in the first wave beside the candidates so
        that a refiner with workers runs them at once (their scores are cached; the
        pick does not depend on them).
        """
        model = self.cost_model(work)
        candidates = self.candidates(
            model, work, train_factor, rollout_factor, homogeneous_only=homogeneous_only
        )
        # Fewest training seconds first. A candidate whose training step alone takes at
        # least the best objective refined so far cannot win (its objective is at least
        # that), so it is not refined: exact pruning of the costly re-score (the twin).
        # A refiner that scores several plans at once (``workers``) gets them in waves of
        # that width; a wave's results are then taken in order under the same rule, so
        # the pick is the one-by-one search's (a run the order would have pruned is
        # spent CPU, not a different answer).
        order = sorted(enumerate(candidates), key=lambda e: e[1].train_s)
        width = max(1, getattr(self.refiner, "workers", 1))
        best: tuple[float, int, Scored] | None = None  # (objective, candidate index, plan)
        extra = list(prefetch) if self.refiner is not None else []
        while order:
            wave: list[tuple[int, Scored]] = []
            while order and len(wave) < max(1, width - len(extra)):
                index, s = order.pop(0)
                if best is not None and (s.train_s, index) >= best[:2]:
                    self.pruned += 1
                else:
                    wave.append((index, s))
            scores = self._refine(model, wave, work, extra)
            extra = []
            for (index, s), rollout_s in zip(wave, scores, strict=True):
                if best is not None and (s.train_s, index) >= best[:2]:
                    continue  # refined by the wave; one by one it would have been pruned
                refined = Scored(s.plan, s.train_s, rollout_s * rollout_factor)
                key = (refined.objective_s, index, refined)
                if not math.isinf(refined.objective_s) and (best is None or key[:2] < best[:2]):
                    best = key
        return best[2] if best is not None else None

    def _refine(
        self, model: RolloutCostModel, wave: list[tuple[int, Scored]], work: Workload,
        extra: Sequence[Plan] = (),
    ) -> list[float]:
        """Uncalibrated rollout seconds of a wave's plans (one call to a batch refiner,
        which also scores ``extra``, for its cache)."""
        many = getattr(self.refiner, "rollout_s_many", None)
        plans = [s.plan for _, s in wave]
        if many is not None and len(plans) + len(extra) > 1:
            return list(many([*extra, *plans], work))[len(extra):]
        if self.refiner is not None:
            for plan in extra:
                self.refiner.rollout_s(plan, work)
        return [self.rollout_s(model, p, work, greedy=True) for p in plans]

    def _closed_form_top_k(
        self, model: RolloutCostModel, work: Workload, train_factor: float, rollout_factor: float
    ) -> list[Scored]:
        """The ``REFINE_TOP_K`` best splits by closed-form objective (ties: fewer train nodes)."""
        scale = work.requests_per_step / len(work.history)
        options = []
        for train_nodes in self._train_node_options():
            par = self.train_parallelism(train_nodes)
            t_train = self.train_s(par, work) * train_factor
            if not math.isinf(t_train):
                options.append((t_train, train_nodes, par))
        options.sort(key=lambda o: (o[0], o[1]))
        top: list[tuple[float, int, Scored]] = []
        for t_train, train_nodes, par in options:
            if len(top) >= REFINE_TOP_K and t_train > top[-1][0]:
                break
            t_roll, layout = self._best_layout(
                model, self.cluster.num_nodes - train_nodes, scale, work.pipeline_depth
            )
            if not layout:
                continue
            nodes = tuple(p for p, n in layout for _ in range(n))
            scored = Scored(Plan(par, nodes), t_train, t_roll * rollout_factor)
            top.append((scored.objective_s, train_nodes, scored))
            top.sort(key=lambda e: (e[0], e[1]))
            del top[REFINE_TOP_K:]
        return [s for _, _, s in top]

    def candidates(
        self, model: RolloutCostModel, work: Workload, train_factor: float = 1.0,
        rollout_factor: float = 1.0, *, homogeneous_only: bool = False,
    ) -> list[Scored]:
        """Every plan ``search`` may refine: the closed form's top splits and, with a
        refiner, the uniform guard and each top split's homogeneous layouts
        (``scheduling.planner.candidates``), less the mixes the closed form does not put
        clearly ahead (``SearchSpace.mix_refine_margin``). ``homogeneous_only``: the
        closed form's top splits, each with its homogeneous layouts as the screen picks
        them (with or without a refiner), and no mix."""
        out = self._closed_form_top_k(model, work, train_factor, rollout_factor)
        if homogeneous_only:
            kept = [s for s in out if cands.is_homogeneous(s.plan)]
            return kept + cands.homogeneous_per_split(self, model, work, out)
        if self.refiner is not None:
            out += self._best_uniform(model, work, out)
            if self.space.homogeneous_per_split:
                out += self._homogeneous_per_split(model, work, out)
            if self.space.mix_refine_margin is not None and not self.space.require_heterogeneous:
                out = cands.screen_mixes(out, self.space.mix_refine_margin)
        return out

    def _best_uniform(
        self, model: RolloutCostModel, work: Workload, taken: list[Scored]
    ) -> list[Scored]:
        return cands.best_uniform(self, model, work, taken)

    def _homogeneous_per_split(
        self, model: RolloutCostModel, work: Workload, taken: list[Scored]
    ) -> list[Scored]:
        return cands.homogeneous_per_split(self, model, work, taken)

    def train_node_options(self) -> list[int]:
        """Training node counts the space allows whose devices hold whole replicas."""
        return self._train_node_options()

    def _train_node_options(self) -> list[int]:
        """Training node counts the space allows whose devices hold whole replicas."""
        sp = self.space
        if sp.fixed_train_nodes is not None:
            nodes = [sp.fixed_train_nodes]
        else:
            last = self.cluster.num_nodes - sp.min_rollout_nodes
            nodes = list(range(sp.min_train_nodes, last + 1))
        replica = sp.train_tp * sp.train_pp
        return [n for n in nodes if (n * self.cluster.gpus_per_node) % replica == 0]

    def _best_layout(
        self, model: RolloutCostModel, num_nodes: int, scale: float, depth: int
    ) -> tuple[float, tuple]:
        """Layout of ``num_nodes`` with the smallest closed-form makespan (first on ties)."""
        index, t = model.best_fast_layout(self._counts(num_nodes), scale, depth)
        if index < 0:
            return math.inf, ()
        return t, self.layouts(num_nodes)[index]

    def _counts(self, num_nodes: int) -> list[LayoutCounts]:
        """Instances per TP degree of each layout of ``num_nodes`` (cached per node count)."""
        if num_nodes not in self._layout_counts:
            rows: list[LayoutCounts] = []
            for layout in self.layouts(num_nodes):
                counts: dict[int, int] = {}
                for pattern, n in layout:
                    for tp in pattern:
                        counts[tp] = counts.get(tp, 0) + n
                rows.append((tuple(counts.items()), sum(counts.values()), max(counts)))
            self._layout_counts[num_nodes] = rows
        return self._layout_counts[num_nodes]


def _check_space(space: SearchSpace, cluster: ClusterShape) -> None:
    """Raise ``PlanError`` for a search space no plan of ``cluster`` can satisfy."""
    if cluster.num_nodes <= 0 or cluster.gpus_per_node <= 0:
        raise PlanError(
            f"cluster: needs at least one node and one device per node, got "
            f"{cluster.num_nodes} x {cluster.gpus_per_node}"
        )
    for pattern in space.node_patterns:
        if sum(pattern) != cluster.gpus_per_node or any(tp <= 0 for tp in pattern):
            raise PlanError(
                f"node_patterns: {list(pattern)} does not fill {cluster.gpus_per_node} devices"
            )
    if space.min_train_nodes < 1 or space.min_rollout_nodes < 1:
        raise PlanError(
            "min_train_nodes/min_rollout_nodes: both stages need at least one node, got "
            f"{space.min_train_nodes}/{space.min_rollout_nodes}"
        )
    replica = space.train_tp * space.train_pp
    if replica <= 0 or (cluster.gpus_per_node % replica and replica % cluster.gpus_per_node):
        raise PlanError(
            f"train_tp*train_pp: replica size {replica} does not divide the "
            f"{cluster.gpus_per_node}-device node nor is a multiple of it"
        )
    if not isinstance(space.homogeneous_per_split, bool):
        raise PlanError(
            f"homogeneous_per_split: must be True or False, got {space.homogeneous_per_split!r}"
        )
    if space.homogeneous_screen not in cands.HOMOGENEOUS_SCREENS:
        raise PlanError(
            f"homogeneous_screen: must be one of {', '.join(cands.HOMOGENEOUS_SCREENS)}, "
            f"got {space.homogeneous_screen!r}"
        )
    margin = space.mix_refine_margin
    if margin is not None and (
        isinstance(margin, bool) or not isinstance(margin, (int, float))
        or not 0.0 <= margin < 1.0
    ):
        raise PlanError(f"mix_refine_margin: must be None or in [0, 1), got {margin!r}")
    fixed = space.fixed_train_nodes
    if fixed is not None and not 1 <= fixed <= cluster.num_nodes - space.min_rollout_nodes:
        raise PlanError(
            f"fixed_train_nodes: {fixed} leaves a stage with no node on a "
            f"{cluster.num_nodes}-node cluster (min rollout nodes {space.min_rollout_nodes})"
        )


def _scaled(history: Sequence[RequestStats], n: int) -> list[RequestStats]:
    """``n`` requests drawn evenly (deterministically) from the history."""
    if n >= len(history):
        reps = -(-n // len(history))
        return (list(history) * reps)[:n]
    stride = len(history) / n
    return [history[int(i * stride)] for i in range(n)]
