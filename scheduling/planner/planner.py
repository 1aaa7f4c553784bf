"""The Global Resource Planner's decision loop (design digest 5.4-5.5), pure.

Each training step the caller reports ``StepMetrics``; ``decide(step)`` then

1. checks the gates (enabled, cool-down, warm-up, history size) and the triggers
   (interval; queue / active pressure, rejected growth, rollout/train ratio);
2. if fired, searches for a candidate and applies it only when it differs from the
   current plan, ``gain x gain_horizon_steps - transition_cost > 0`` and
   ``gain / current >= min_gain_ratio``;
3. derives the elastic signal (join / release / hold, with hysteresis, a rollout
   reserve and a TTL).

Every call returns a ``PlanEvent`` (applied or not) carrying its inputs and the
predicted gain, so the coordinator can log it and the simulator can count moves.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from scheduling.planner.calibration import RatioCalibrator
from scheduling.planner.costmodel import RequestStats, TrainParallelism
from scheduling.planner.elastic_trigger import ElasticTrigger
from scheduling.planner.move_cost import migrated_move_cost
from scheduling.planner.plan import Plan, PlanError
from scheduling.planner.planner_types import ElasticSignal, PlanEvent, PlannerConfig, StepMetrics
from scheduling.planner.search import PlanSearch, Scored, Workload


class GlobalResourcePlanner:
    """Triggers, net-gain rule, calibration and elastic signals around ``PlanSearch``.

    Args:
        search: Plan scorer/searcher for the cluster.
        config: Knobs.
        current: Plan in force (``None`` until ``preflight``).
    """

    def __init__(
        self, search: PlanSearch, config: PlannerConfig, current: Plan | None = None
    ) -> None:
        self._search = search
        self._config = config
        space = getattr(search, "space", None)
        if config.preflight_layouts == "homogeneous" and getattr(
            space, "require_heterogeneous", False
        ):
            raise PlanError(
                "preflight_layouts: 'homogeneous' contradicts the search space's "
                "require_heterogeneous (no layout could be adopted)"
            )
        self.current = current
        if current is not None:
            current.validate(search.cluster)
        self._history: deque[RequestStats] = deque(maxlen=config.max_history_size)
        self._rollout_cal = RatioCalibrator(config.calibrator)
        self._train_cal = RatioCalibrator(config.calibrator)
        self._last: StepMetrics | None = None
        self._last_applied_step: int | None = None
        self._last_rejected = 0
        self._requests_per_step = 1
        self._trigger_pool = ElasticTrigger(config)
        self._work: Workload | None = None

    @property
    def history_size(self) -> int:
        """Length-history records held."""
        return len(self._history)

    @property
    def factors(self) -> tuple[float, float]:
        """Calibration factors (train, rollout)."""
        return self._train_cal.factor, self._rollout_cal.factor

    def add_history(self, requests: list[RequestStats] | tuple[RequestStats, ...]) -> None:
        """Append records to the sliding length history."""
        if requests:
            self._history.extend(requests)
            self._work = None

    def preflight(self, requests_per_step: int) -> PlanEvent:
        """Adopt the best plan with gates open, zero transition cost and zero threshold."""
        self._requests_per_step = max(1, requests_per_step)
        best = self._search_best(homogeneous_only=self._config.preflight_layouts == "homogeneous")
        if best is None:
            return PlanEvent(-1, True, "preflight", False, "infeasible", inputs=self._inputs())
        best.plan.validate(self._search.cluster)
        self.current = best.plan
        self._last_applied_step = -1
        return PlanEvent(
            -1,
            True,
            "preflight",
            True,
            "adopted",
            candidate=best.plan.to_dict(),
            candidate_objective_s=best.objective_s,
            inputs=self._inputs(),
        )

    def rebase(self, plan: Plan) -> None:
        """Replace the plan in force without a decision (``core_replan=False`` callers
        report the effective split each step). Raises ``PlanError`` for an invalid plan."""
        plan.validate(self._search.cluster)
        self.current = plan

    def observe(self, metrics: StepMetrics) -> None:
        """Fold one step's measurements in: history, calibration, pressure counters."""
        self.add_history(metrics.requests)
        self._trigger_pool.observe(metrics)
        if metrics.requests_per_step:
            self._requests_per_step = metrics.requests_per_step
        if self._config.calibrate and self.current is not None and len(self._history) >= 1:
            predicted = self._search.score(self.current, self._workload(), greedy=False)
            self._rollout_cal.observe(predicted.rollout_s, metrics.rollout_s)
            extra = metrics.hybrid_active * self.current.train.tp * self.current.train.pp
            self._train_cal.observe(
                self._search.train_s(self.current.train, self._workload(), extra), metrics.train_s
            )
        self._last = metrics

    def decide(self, step: int) -> PlanEvent:
        """Gate, trigger, search, apply-or-not, elastic signal; always returns an event."""
        trigger, gate_reason = self._trigger(step)
        if trigger is None:
            event = PlanEvent(step, False, "none", False, gate_reason, inputs=self._inputs())
        else:
            event = self._evaluate(step, trigger)
        event.elastic = self._elastic(step, event)
        if self._last is not None:
            self._last_rejected = self._last.rejected_total
        return event

    def signal_at(self, step: int) -> ElasticSignal | None:
        """The signal in force at ``step``; past its TTL, a release of everything."""
        sig = self._trigger_pool.signal
        if sig is None or step <= sig.expires_step:
            return sig
        return ElasticSignal(step, "release", 0, sig.desired_replicas, "ttl_expired", step)

    # Gates and triggers.

    def _trigger(self, step: int) -> tuple[str | None, str]:
        cfg, m = self._config, self._last
        if not cfg.enable_online:
            return None, "online_disabled"
        if self.current is None:
            return None, "no_current_plan"
        if (
            self._last_applied_step is not None
            and step - self._last_applied_step <= cfg.cooldown_steps
        ):
            return None, "cooldown"
        if step < cfg.warmup_steps:
            return None, "warmup"
        if len(self._history) < cfg.min_history_size:
            return None, "history_too_small"
        if step % cfg.plan_interval_steps == 0:
            return "interval", ""
        if m is None:
            return None, "no_metrics"
        if m.queue_pressure >= cfg.queue_pressure_threshold:
            return "queue_pressure", ""
        if m.active_pressure >= cfg.active_pressure_threshold:
            return "active_pressure", ""
        if m.rejected_total - self._last_rejected >= cfg.rejected_growth_threshold:
            return "rejected_growth", ""
        if m.train_s > 0 and m.rollout_s / m.train_s >= cfg.rollout_train_ratio_threshold:
            return "rollout_train_ratio", ""
        return None, "no_trigger"

    def _evaluate(self, step: int, trigger: str) -> PlanEvent:
        assert self.current is not None
        cfg = self._config
        tf, rf = self.factors
        work = self._workload()
        # The search refines the plan in force in its first wave (one wave fewer on a
        # refiner with workers); its score below is then the refiner's cached one.
        best = self._search_best(prefetch=(self.current,))
        current = self._search.score(self.current, work, tf, rf)
        event = PlanEvent(
            step,
            True,
            trigger,
            False,
            "",
            current=self.current.to_dict(),
            current_objective_s=current.objective_s,
            inputs=self._inputs(),
        )
        if best is None:
            event.reason = "no_feasible_candidate"
            return event
        event.candidate = best.plan.to_dict()
        event.candidate_objective_s = best.objective_s
        raw = current.objective_s - best.objective_s
        if math.isinf(current.objective_s):
            raw = math.inf if not math.isinf(best.objective_s) else 0.0
        event.raw_gain_s = raw if not math.isinf(raw) else 1e18
        event.transition_cost_s = self._transition_cost_s(best.plan, current.objective_s)
        # The gain is per step; the transition is paid once: amortise over the horizon.
        event.net_gain_s = event.raw_gain_s * cfg.gain_horizon_steps - event.transition_cost_s
        event.gain_ratio = (
            1.0 if math.isinf(current.objective_s) else raw / max(current.objective_s, 1e-12)
        )
        event.reason = self._refusal(best.plan, event)
        if not event.reason:
            self._apply(best.plan, step)
            event.applied = True
            event.reason = "applied" if cfg.core_replan else "applied_via_elastic"
        return event

    def _transition_cost_s(self, candidate: Plan, current_s: float) -> float:
        """The move's modelled cost: fixed, plus (``recreated``) the in-flight work of the
        rollout devices it re-creates, about one current step of their share."""
        assert self.current is not None
        cost = self._config.transition_cost_s
        model = self._config.transition_cost_model
        if model == "recreated" and not math.isinf(current_s):
            share = self.current.rollout_share_recreated(
                candidate, self._search.cluster.gpus_per_node
            )
            cost += current_s * share
        elif model == "migrated":
            search = self._search
            cost += migrated_move_cost(
                self.current, candidate, self._workload(), search.hw, search.model,
                search.cluster.gpus_per_node, self._config.weight_load_bw_bytes_per_s,
                self._last.in_flight_trajectories if self._last is not None else None,
            ).total_s
        return cost

    def _refusal(self, candidate: Plan, event: PlanEvent) -> str:
        """Why ``candidate`` is not applied ("" when it is): same plan, invalid plan,
        net gain not positive, or relative gain under the threshold."""
        assert self.current is not None
        if candidate.key() == self.current.key():
            return "same_plan"
        try:
            candidate.validate(self._search.cluster)
        except PlanError as err:
            return f"invalid_candidate: {err}"
        if event.net_gain_s <= 0:
            return "net_gain_not_positive"
        if event.gain_ratio < self._config.min_gain_ratio:
            return "gain_ratio_below_threshold"
        return ""

    def _apply(self, plan: Plan, step: int) -> None:
        if self._config.core_replan:
            self.current = plan
        self._last_applied_step = step

    def _search_best(
        self, *, homogeneous_only: bool = False, prefetch: tuple[Plan, ...] = ()
    ) -> Scored | None:
        if not self._history:
            return None
        tf, rf = self.factors
        return self._search.search(
            self._workload(), tf, rf, homogeneous_only=homogeneous_only, prefetch=prefetch
        )

    def _workload(self) -> Workload:
        """The current workload; one object until the history or batch size changes, so the
        search reuses its cost model within a step."""
        work = self._work
        if work is None or work.requests_per_step != self._requests_per_step:
            work = self._work = Workload(
                self._requests_per_step, tuple(self._history), self._config.pipeline_depth
            )
        return work

    # Elastic hybrid pool.

    def _elastic(self, step: int, event: PlanEvent) -> ElasticSignal | None:
        if self.current is None or self._last is None:
            return None
        judge = self._borrow_pays if self._config.elastic_borrow_judged else None
        return self._trigger_pool.decide(step, event, self.current, self._last, judge=judge)

    def _borrow_pays(self, replicas: int) -> bool:
        """Whether lending ``replicas`` rollout replicas to training is predicted to
        shorten the step by ``min_gain_ratio`` (the search's scores: the twin's, where
        it has one). The pool lends the highest-numbered rollout nodes."""
        assert self.current is not None
        cur = self.current
        gpn = self._search.cluster.gpus_per_node
        replica = cur.train.tp * cur.train.pp
        lent_nodes = -(-replicas * replica // gpn)
        if replicas <= 0 or lent_nodes >= len(cur.rollout_nodes):
            return True  # nothing to judge, or the trigger's own capacity rule binds
        lent = Plan(
            TrainParallelism(cur.train.tp, cur.train.pp, cur.train.dp + replicas,
                             cur.train.micro_batch),
            cur.rollout_nodes[:-lent_nodes],
        )
        tf, rf = self.factors
        work = self._workload()
        self._search.prefetch((cur, lent), work)  # both at once on the twin's workers
        now_s = self._search.score(cur, work, tf, rf).objective_s
        lent_s = self._search.score(lent, work, tf, rf).objective_s
        return lent_s < now_s * (1.0 - self._config.min_gain_ratio)

    def _inputs(self) -> dict[str, Any]:
        m = self._last
        tf, rf = self.factors
        return {
            "history_size": len(self._history),
            "requests_per_step": self._requests_per_step,
            "train_factor": round(tf, 4),
            "rollout_factor": round(rf, 4),
            "rollout_s": m.rollout_s if m else None,
            "train_s": m.train_s if m else None,
            "queue_pressure": m.queue_pressure if m else None,
            "active_pressure": m.active_pressure if m else None,
            "rejected_total": m.rejected_total if m else None,
        }
