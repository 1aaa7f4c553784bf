"""The elastic hybrid pool's signal (design digest 5.5), pure.

Rules, in order: no capacity -> 0; rollout pressure -> 0; a candidate that wants more
training and was not applied -> its extra replicas (``core_replan``) / an approved
candidate -> current + its extra replicas (``core_replan=False``); train / rollout at
or above the borrow ratio -> all capacity; at or below the release ratio -> 0;
otherwise hold.

The rollout side of the ratio (issue 20 item 5, fourth bullet): the gap between two
step completions swings from seconds to minutes in a pipelined job (a burst of steps
finishes together, then a long one), so a trigger on it flaps. With
``elastic_span_alpha > 0`` and a reported ``rollout_span_s`` the trigger reads instead an
EMA of each step's release-to-completion span divided by the pipeline depth (steps in
flight share the rollout stage: Little's law), and with ``elastic_dwell_steps`` a change
of the pool must stand that many steps before the next (forced releases excepted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduling.planner.planner_types import ElasticSignal, PlanEvent, PlannerConfig, StepMetrics

if TYPE_CHECKING:
    from scheduling.planner.plan import Plan

FORCED = frozenset({"no_capacity", "rollout_pressure"})
"""Releases the dwell never holds back."""


class ElasticTrigger:
    """Smoothed rollout estimate, the digest's rules and the dwell.

    Args:
        config: The planner's knobs (``elastic_*``, ``pipeline_depth``, ``core_replan``).
    """

    def __init__(self, config: PlannerConfig) -> None:
        self._config = config
        self.signal: ElasticSignal | None = None
        self.span_ema_s: float | None = None
        self._last_change_step: int | None = None
        self._last_refusal_step: int | None = None

    def observe(self, metrics: StepMetrics) -> None:
        """Fold a step's rollout span into the EMA (ignored when absent or not positive)."""
        alpha, span = self._config.elastic_span_alpha, metrics.rollout_span_s
        if alpha <= 0 or span is None or not span > 0 or math.isinf(span):
            return
        old = self.span_ema_s
        self.span_ema_s = span if old is None else (1 - alpha) * old + alpha * span

    def rollout_estimate_s(self, metrics: StepMetrics) -> float:
        """Rollout time per step the ratio reads: smoothed span / depth, else ``rollout_s``."""
        if self.span_ema_s is None:
            return metrics.rollout_s
        return self.span_ema_s / self._config.pipeline_depth

    def decide(
        self, step: int, event: PlanEvent, plan: Plan, metrics: StepMetrics,
        judge: Callable[[int], bool] | None = None,
    ) -> ElasticSignal | None:
        """The signal for ``step`` (``None`` with the pool disabled). ``judge``: asked
        before a borrow whether lending that many replicas pays (``None``: the ratio
        alone decides)."""
        cfg = self._config
        if not cfg.enable_elastic:
            return None
        current = metrics.hybrid_active + metrics.hybrid_joining
        desired, reason = self._desired(event, plan, metrics, current)
        if reason == "borrow" and desired > current and judge is not None:
            desired, reason = self._judged(step, desired, current, judge)
        last = self._last_change_step
        if (
            desired != current
            and reason not in FORCED
            and last is not None
            and step - last < cfg.elastic_dwell_steps
        ):
            desired, reason = current, "dwell"
        if desired != current:
            self._last_change_step = step
        action = "join" if desired > current else "release" if desired < current else "hold"
        self.signal = ElasticSignal(
            step, action, desired, current, reason, step + cfg.elastic_ttl_steps
        )
        return self.signal

    def _judged(
        self, step: int, desired: int, current: int, judge: Callable[[int], bool]
    ) -> tuple[int, str]:
        """A borrow the judge refuses is held, and the refusal stands for the dwell like
        a change would (each judgement costs the search a score of two plans)."""
        last = self._last_refusal_step
        if last is not None and step - last < self._config.elastic_dwell_steps:
            return current, "dwell"
        if judge(desired):
            return desired, "borrow"
        self._last_refusal_step = step
        return current, "borrow_not_predicted_to_pay"

    def _desired(
        self, event: PlanEvent, plan: Plan, m: StepMetrics, current: int
    ) -> tuple[int, str]:
        """Digest 5.5, in order: capacity, rollout pressure, candidate, borrow, release, hold."""
        cfg = self._config
        replica = plan.train.tp * plan.train.pp
        capacity = max(0, (plan.rollout_gpus - cfg.elastic_reserve_gpus) // replica)
        if m.elastic_capacity_replicas is not None:
            capacity = max(0, m.elastic_capacity_replicas)
        rollout = self.rollout_estimate_s(m)
        ratio = m.train_s / rollout if rollout > 0 else math.inf
        extra = 0
        if event.candidate:
            extra = (event.candidate["train_gpus"] - plan.train_gpus) // replica
        if capacity == 0:
            return 0, "no_capacity"
        if max(m.queue_pressure, m.active_pressure) >= cfg.elastic_pressure_threshold:
            return 0, "rollout_pressure"
        if cfg.core_replan and extra > 0 and not event.applied:
            return min(capacity, extra), "candidate_wants_training"
        if not cfg.core_replan and event.applied:
            return max(0, min(capacity, current + extra)), "approved_plan"
        if cfg.elastic_span_alpha > 0 and self.span_ema_s is None:
            # Smoothing asked for but no span reported yet (a streaming job's pipeline
            # is still filling, its first batches being the shortest trajectories): the
            # step gaps would read as a fast rollout stage and lend it away (issue 20).
            return current, "no_span_yet"
        if ratio >= cfg.elastic_borrow_ratio:
            return capacity, "borrow"
        if ratio <= cfg.elastic_release_ratio:
            return 0, "release"
        return current, "hold"
