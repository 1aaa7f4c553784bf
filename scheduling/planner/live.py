"""Live facade: the planner core driven by a running job's step records (pure).

The coordinator calls ``LivePlanner.on_step(record, leases, pressure)`` once per trainer
step. It returns a JSON-able decision event and an elastic signal, both produced by the
same ``GlobalResourcePlanner`` the simulator uses (triggers, cool-down, warm-up, the
net-gain rule, elastic hysteresis, reserve, TTL); only the cost model differs.

Deployment model (CPU services): every worker is one device, a training replica is one
worker, and the pool is every leased worker except ``service`` ones. Core roles are
fixed by the job (``core_replan=False``): the planner's plan is the *effective* split,
training = core-training + hybrid-joining + hybrid-training workers, rollout = the
rest; an approved plan is carried out by lending or returning hybrid workers. The
services' trainer takes no lease: ``LiveConfig.min_core_training`` (1 from
``live_planner``) counts it as the core-training worker.

``live_planner(spec)`` builds the planner from a job spec's ``[elastic]`` section (the
coordinator's ``ElasticWiring.planner_factory``).

Cost model (fitted to the job's own measured steps, no constants; two numbers):

- ``w_train`` = EMA of ``train_s x n_train`` where ``n_train`` = core-training workers +
  hybrids that trained that step (``record["hybrid_slices"]``: slices whose gradient
  arrived; else ``record["hybrid_workers"]``; else the hybrid-training leases).
  Predicted ``T_train(t) = w_train / t``: linear data-parallel scaling, no
  gradient-exchange overhead beyond what the measurements hold.
- ``w_rollout`` = EMA of ``rollout_s x n_rollout`` where ``rollout_s`` is the trainer's
  measured wait for its batch and ``n_rollout`` = core-rollout + hybrid-rollout
  workers. Predicted ``T_rollout(r) = w_rollout / r``.
- Objective, as in the core: ``max(T_train, T_rollout)`` (the slower stage sets the
  step interval of a pipelined job).

Limits, stated plainly: the wait under-states the rollout stage when training is the
bottleneck (the trainer then waits ~0), so the model favours lending workers until
waiting reappears; the hysteresis band, the transition cost and the cool-down keep this
from oscillating. Joining workers count as training for the split (they have left
rollout) but not for the measured ``n_train`` until they train.

Bad input raises ``PlanError`` naming the field (unknown role, missing or negative step
times). A pool the planner cannot run (no core-training worker, or no rollout worker)
is a documented refusal: the decision says ``pool_invalid: ...`` and the elastic signal
is the previous one, whose TTL keeps running (expired: release everything).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from libra.jobspec import AlgorithmSpec, ElasticSpec
from scheduling.planner.costmodel import RequestStats
from scheduling.planner.live_model import (
    ROLES,
    LiveCostModel,
    LiveSearch,
    LiveSignal,
    Pool,
    count_roles,
)
from scheduling.planner.plan import PlanError, pipeline_depth
from scheduling.planner.planner import (
    ElasticSignal,
    GlobalResourcePlanner,
    PlanEvent,
    PlannerConfig,
    StepMetrics,
)

__all__ = [
    "FORCED_REASONS", "MAX_TRAJECTORIES_PER_RECORD", "ROLES", "LiveConfig", "LiveCostModel",
    "LivePlanner", "LiveSearch", "LiveSignal", "Pool", "count_roles", "live_planner",
]

MAX_TRAJECTORIES_PER_RECORD = 4096
"""Length-history records one step may add (the core keeps at most 4,096)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveConfig:
    """Knobs of the live planner (the job spec's ``elastic`` section maps onto these)."""

    reserve_workers: int = 1
    """Rollout workers never lent to training (at least one is always kept)."""
    borrow_ratio: float = 1.15
    """Lend when train_s / rollout_s reaches this."""
    release_ratio: float = 0.90
    """Return when train_s / rollout_s falls to this; in between: hold (hysteresis)."""
    ttl_steps: int = 20
    interval_steps: int = 10
    cooldown_steps: int = 1
    warmup_steps: int = 1
    transition_cost_s: float = 15.0
    """Predicted seconds a move costs (state fetch, process start); the gain must beat it."""
    min_gain_ratio: float = 0.05
    min_history_trajectories: int = 8
    pressure_cap: float = 0.80
    """Rollout pressure at or above which every hybrid goes back to rollout."""
    ema_alpha: float = 0.3
    """Weight of the newest step in the fitted ``w_train`` / ``w_rollout``."""
    min_core_training: int = 0
    """Core-training workers counted when the leases show fewer (a trainer that holds no
    lease; the services' trainer is one: ``live_planner`` sets 1)."""
    force_hybrids: int = -1
    """Operator override: keep exactly this many hybrids lent (capped by the capacity);
    -1 lets the planner decide. Decisions are still evaluated and recorded."""
    min_dwell_steps: int = 5
    """Steps a move must stand before the next one (forced releases excepted): a lent or
    returned worker changes the very ratio the signal reads, so without it the pool
    swings back and forth every step."""
    max_staleness: int = 1
    """The job's ``algorithm.max_staleness``; the planner's pipeline depth is
    ``pipeline_depth(max_staleness)``, the function the simulator uses too."""

    def __post_init__(self) -> None:
        if not 0 < self.ema_alpha <= 1:
            raise ValueError(f"ema_alpha must be in (0, 1], got {self.ema_alpha}")
        if self.min_core_training < 0:
            raise ValueError(f"min_core_training must be >= 0, got {self.min_core_training}")
        if self.force_hybrids < -1:
            raise ValueError(f"force_hybrids must be >= -1, got {self.force_hybrids}")
        if self.min_dwell_steps < 0:
            raise ValueError(f"min_dwell_steps must be >= 0, got {self.min_dwell_steps}")

    def planner_config(self) -> PlannerConfig:
        """The core's config (also validates the knobs; ``ValueError`` names the field)."""
        return PlannerConfig(
            plan_interval_steps=self.interval_steps,
            warmup_steps=self.warmup_steps,
            min_history_size=self.min_history_trajectories,
            cooldown_steps=self.cooldown_steps,
            min_gain_ratio=self.min_gain_ratio,
            transition_cost_s=self.transition_cost_s,
            elastic_reserve_gpus=self.reserve_workers,
            elastic_pressure_threshold=self.pressure_cap,
            elastic_borrow_ratio=self.borrow_ratio,
            elastic_release_ratio=self.release_ratio,
            elastic_ttl_steps=self.ttl_steps,
            calibrate=False,
            core_replan=False,
            pipeline_depth=pipeline_depth(self.max_staleness),
        )


class LivePlanner:
    """Per-step planner for the running services (see the module docstring)."""

    def __init__(self, config: LiveConfig | None = None) -> None:
        self.config = config or LiveConfig()
        self.model = LiveCostModel(self.config.ema_alpha)
        self._search = LiveSearch(self.model, self.config.reserve_workers)
        self._planner = GlobalResourcePlanner(
            self._search, self.config.planner_config()  # type: ignore[arg-type]
        )
        self._last_move_step: int | None = None
        self._last_target: int | None = None  # hybrids the last move asked for

    def on_step(
        self,
        record: Mapping[str, Any],
        leases: Iterable[Any],
        pressure: Mapping[str, float] | None = None,
    ) -> dict[str, Any]:
        """Fold one trainer step in and decide.

        Args:
            record: Trainer step record: ``step``, ``rollout_s`` (wait for data),
                ``train_s``; optional ``num_trajectories``, ``tokens_mean``,
                ``hybrid_slices`` (hybrids whose gradient this step used), else
                ``hybrid_workers`` (active hybrids this step).
            leases: Live worker leases (``role`` attribute or key, see ``ROLES``).
            pressure: Scheduler numbers ``queue_pressure``, ``active_pressure``,
                ``rejected_total`` (each 0 when absent).

        Returns:
            ``{"step", "decision", "elastic"}``; see ``docs/planner.md`` for the keys.

        Raises:
            PlanError: Malformed record or lease (the message names the field).
        """
        step, rollout_s, train_s = _record_times(record)
        pool = self._pool(leases)
        problem = _pool_problem(pool)
        if problem:
            return self._refusal(step, problem, pool)
        self._search.set_pool(pool)
        self._planner.rebase(self._search.plan(pool.train_workers))
        n_train = pool.core_training + _hybrids_trained(record, pool)
        self.model.observe(train_s, n_train, rollout_s, pool.core_rollout + pool.hybrid_rollout)
        self._planner.observe(self._metrics(record, step, rollout_s, train_s, pool, pressure))
        event = self._planner.decide(step)
        return {
            "step": step,
            "decision": self._decision_dict(event, pool),
            "elastic": _signal_dict(self._damp(event.elastic, step, pool)),
        }

    def _damp(self, signal: ElasticSignal | None, step: int, pool: Pool
              ) -> ElasticSignal | None:
        """Temper the ratio rule with the fitted model: move to the hybrid count between
        the current and the desired one that the model predicts fastest, only when it
        beats the current split by ``min_gain_ratio`` and the last move has stood
        ``min_dwell_steps``; otherwise hold. Forced releases always pass."""
        if signal is not None and self.config.force_hybrids >= 0:
            want = min(self.config.force_hybrids, pool.capacity(self.config.reserve_workers))
            held = signal.current_replicas
            action = "join" if want > held else "release" if want < held else "hold"
            return replace(signal, action=action, desired_replicas=want, reason="forced")
        if signal is None or signal.action == "hold":
            return signal
        if signal.reason in FORCED_REASONS:
            self._last_move_step, self._last_target = step, signal.desired_replicas
            return signal
        held = signal.current_replicas
        # A hold keeps the last move's target: its joins may not show in the leases yet.
        target = held if self._last_target is None else self._last_target
        since = self._last_move_step
        if since is not None and step - since < self.config.min_dwell_steps:
            return replace(signal, action="hold", desired_replicas=target,
                           reason=f"dwell:{signal.reason}")
        lo, hi = sorted((held, signal.desired_replicas))
        best = min(range(lo, hi + 1),
                   key=lambda n: (self._objective_s(pool, n), abs(n - held)))
        if not self._objective_s(pool, best) < (
                self._objective_s(pool, held) * (1 - self.config.min_gain_ratio)):
            return replace(signal, action="hold", desired_replicas=target,
                           reason=f"no_predicted_gain:{signal.reason}")
        self._last_move_step, self._last_target = step, best
        return replace(signal, action="join" if best > held else "release",
                       desired_replicas=best)

    def _objective_s(self, pool: Pool, hybrids: int) -> float:
        """Predicted step time (max of train and rollout) with ``hybrids`` lent."""
        rollout_side = pool.core_rollout + pool.hybrid_rollout + pool.lent
        return max(self.model.times_s(pool.core_training + hybrids, rollout_side - hybrids))

    def _pool(self, leases: Iterable[Any]) -> Pool:
        """Leases by role, with at least ``min_core_training`` core-training workers."""
        pool = count_roles(leases)
        floor = self.config.min_core_training
        return pool if pool.core_training >= floor else replace(pool, core_training=floor)

    def signal_at(self, step: int) -> dict[str, Any] | None:
        """The elastic signal in force at ``step`` (past its TTL: release everything)."""
        return _signal_dict(self._planner.signal_at(step))

    def observe(
        self, step_record: Mapping[str, Any], workers: Iterable[Any],
        pressure: Mapping[str, float] | None = None,
    ) -> tuple[dict[str, Any], LiveSignal | None]:
        """``on_step`` in the shape of the coordinator's ``ElasticPlanner`` protocol:
        (decision event with ``elastic`` inside, signal with ``action``, ``desired``,
        ``current``, ``reason``, ``ttl_step``)."""
        out = self.on_step(step_record, workers, pressure)
        decision = {**out["decision"], "elastic": out["elastic"]}
        sig = out["elastic"]
        if sig is None:
            return decision, None
        return decision, LiveSignal(sig["action"], sig["desired_hybrids"],
                                    sig["current_hybrids"], sig["reason"], sig["ttl_step"])

    def _metrics(
        self, record: Mapping[str, Any], step: int, rollout_s: float, train_s: float,
        pool: Pool, pressure: Mapping[str, float] | None,
    ) -> StepMetrics:
        pressure = pressure or {}
        num = max(0, int(record.get("num_trajectories", 0) or 0))
        tokens = max(1, int(record.get("tokens_mean", 1) or 1))
        requests = (RequestStats(0, tokens),) * min(num, MAX_TRAJECTORIES_PER_RECORD)
        return StepMetrics(
            step=step, rollout_s=rollout_s, train_s=train_s,
            queue_pressure=float(pressure.get("queue_pressure", 0.0) or 0.0),
            active_pressure=float(pressure.get("active_pressure", 0.0) or 0.0),
            rejected_total=int(pressure.get("rejected_total", 0) or 0),
            hybrid_active=pool.hybrid_training, hybrid_joining=pool.hybrid_joining,
            requests=requests, requests_per_step=num,
            elastic_capacity_replicas=pool.capacity(self.config.reserve_workers),
        )

    def _decision_dict(self, event: PlanEvent, pool: Pool) -> dict[str, Any]:
        out = event.to_dict()
        out.pop("elastic", None)
        for key in ("current", "candidate"):
            if out[key] is not None:
                out[key] = {"train_workers": out[key]["train_gpus"],
                            "rollout_workers": out[key]["rollout_gpus"]}
        out["inputs"].update(
            pool=pool.to_dict(),
            capacity=pool.capacity(self.config.reserve_workers),
            w_train=self.model.w_train,
            w_rollout=self.model.w_rollout,
        )
        return out

    def _refusal(self, step: int, problem: str, pool: Pool) -> dict[str, Any]:
        reason = f"pool_invalid: {problem}"
        decision = PlanEvent(step, False, "none", False, reason, inputs={"pool": pool.to_dict()})
        out = decision.to_dict()
        out.pop("elastic", None)
        return {"step": step, "decision": out, "elastic": self.signal_at(step)}


def _record_times(record: Mapping[str, Any]) -> tuple[int, float, float]:
    """(step, rollout_s, train_s) of a step record; ``PlanError`` naming a bad field."""
    values = []
    for key in ("step", "rollout_s", "train_s"):
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
            isinstance(value, float) and not math.isfinite(value)
        ):
            raise PlanError(f"record.{key}: expected a finite number >= 0, got {value!r}")
        values.append(value)
    return int(values[0]), float(values[1]), float(values[2])


def _hybrids_trained(record: Mapping[str, Any], pool: Pool) -> int:
    """Hybrids whose work this step's ``train_s`` holds; ``PlanError`` naming a bad field."""
    for key in ("hybrid_slices", "hybrid_workers"):
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 <= value < math.inf
        ):
            raise PlanError(f"record.{key}: expected a finite number >= 0, got {value!r}")
        return int(value)
    return pool.hybrid_training


def _pool_problem(pool: Pool) -> str:
    if pool.core_training == 0:
        return "no core-training worker (training would have zero workers)"
    if pool.core_rollout + pool.hybrid_rollout + pool.lent == 0:
        return "no rollout-capable worker (rollout would have zero workers)"
    return ""


def _signal_dict(signal: ElasticSignal | None) -> dict[str, Any] | None:
    if signal is None:
        return None
    return {
        "step": signal.step,
        "action": signal.action,
        "desired_hybrids": signal.desired_replicas,
        "current_hybrids": signal.current_replicas,
        "reason": signal.reason,
        "ttl_step": signal.expires_step,
    }


# Releases the planner must make whatever the model says.
FORCED_REASONS = frozenset({"no_capacity", "rollout_pressure", "expired"})


def live_planner(spec: ElasticSpec, max_staleness: int | None = None) -> LivePlanner:
    """The planner for a job's ``[elastic]`` section (``ElasticWiring.planner_factory``).

    Same-named knobs carry over; ``pressure_threshold`` -> ``pressure_cap`` and
    ``plan_interval_steps`` -> ``interval_steps``. ``min_history_trajectories`` and
    ``ema_alpha`` have no spec knob and keep ``LiveConfig``'s defaults; ``enabled``,
    ``join_timeout_s``, ``gradient_deadline_s`` and ``lockstep_check_interval`` belong to
    the executor and the trainer. The services' trainer holds no lease, so it is counted
    as the one core-training worker (``min_core_training=1``; elastic jobs train on one
    rank). ``max_staleness`` is the job's ``algorithm.max_staleness`` (the coordinator
    passes it; default: the spec default). Raises ``ValueError`` naming a knob the core refuses.
    """
    config = LiveConfig(
        reserve_workers=spec.reserve_workers,
        borrow_ratio=spec.borrow_ratio,
        release_ratio=spec.release_ratio,
        ttl_steps=spec.ttl_steps,
        interval_steps=spec.plan_interval_steps,
        cooldown_steps=spec.cooldown_steps,
        warmup_steps=spec.warmup_steps,
        transition_cost_s=spec.transition_cost_s,
        min_gain_ratio=spec.min_gain_ratio,
        pressure_cap=spec.pressure_threshold,
        min_core_training=1,
        min_dwell_steps=spec.min_dwell_steps,
        force_hybrids=spec.force_hybrids,
        max_staleness=AlgorithmSpec().max_staleness if max_staleness is None else max_staleness,
    )
    return LivePlanner(config)
