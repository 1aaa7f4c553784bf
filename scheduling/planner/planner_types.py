"""The planner's value types: its knobs, what each step reports, what each decision says.

Apart from ``planner.py`` so the elastic trigger can name them without importing the
decision loop that uses it (the package forbids import cycles, type-only ones included).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from scheduling.planner.calibration import CalibratorConfig
from scheduling.planner.costmodel import RequestStats
from scheduling.planner.plan import PlanError

TRANSITION_COST_MODELS = ("fixed", "recreated", "migrated")
"""Values of ``PlannerConfig.transition_cost_model``."""
PREFLIGHT_LAYOUTS = ("any", "homogeneous")
"""Values of ``PlannerConfig.preflight_layouts``."""


@dataclass(frozen=True, slots=True)
class ElasticSignal:
    """Desired number of hybrid replicas lent to training, valid until ``expires_step``."""

    step: int
    action: str
    """``join``, ``release`` or ``hold``."""
    desired_replicas: int
    current_replicas: int
    reason: str
    expires_step: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerConfig:
    """Planner knobs; defaults are the reference's (digest 5.4 table)."""

    enable_online: bool = True
    plan_interval_steps: int = 10
    warmup_steps: int = 1
    min_history_size: int = 8
    max_history_size: int = 4096
    cooldown_steps: int = 1
    queue_pressure_threshold: float = 0.75
    active_pressure_threshold: float = 0.85
    rejected_growth_threshold: int = 8
    rollout_train_ratio_threshold: float = 1.25
    min_gain_ratio: float = 0.05
    transition_cost_s: float = 15.0
    gain_horizon_steps: int = 1
    """Steps a predicted per-step gain is counted over before the one-off
    ``transition_cost_s`` is taken from it: ``net = gain_s x horizon - cost``. 1 is the
    reference's rule (digest 5.4), which takes a cost in seconds from a gain in seconds
    *per step*; a plan applied on the interval runs at least until the next interval
    decision, so ``plan_interval_steps`` compares like with like (issue 20, session 15)."""
    # Elastic hybrid pool (digest 5.5).
    enable_elastic: bool = True
    elastic_reserve_gpus: int = 8
    """Rollout devices never lent to training (reference: one node)."""
    elastic_pressure_threshold: float = 0.80
    elastic_borrow_ratio: float = 1.15
    """Join when train / rollout time reaches this."""
    elastic_release_ratio: float = 0.90
    """Release when train / rollout time falls to this; in between: hold (hysteresis)."""
    elastic_ttl_steps: int = 20
    elastic_span_alpha: float = 0.0
    """Weight of the newest step in the smoothed rollout-span estimate (EMA of each
    step's release-to-completion span over the pipeline depth), which the borrow and
    release ratios read when the caller reports ``rollout_span_s``; 0: no smoothing
    (the step's own ``rollout_s``)."""
    elastic_dwell_steps: int = 0
    """Steps a change of the pool size must stand before the next (forced releases
    excepted); 0: none."""
    elastic_borrow_judged: bool = False
    """Before the ratio rule lends rollout replicas to training, score the plan with
    them lent against the plan in force (the search's scores: the twin's, where it has
    one) and lend only for a gain of ``min_gain_ratio``. ``False``: the ratio alone
    (digest 5.5). A ratio of measured times cannot see that a bounded-staleness step
    waits on its stragglers, not its training (issue 20, session 16)."""
    pipeline_depth: int = 1
    """Rollout steps in flight at once (async jobs: staleness bound + 1)."""
    calibrator: CalibratorConfig = field(default_factory=CalibratorConfig)
    calibrate: bool = True
    """Scale predictions by measured / predicted (off when the cost model is itself fitted
    to the job's measurements, as in ``live``)."""
    core_replan: bool = True
    """True: an approved candidate replaces the core plan (the simulator re-creates
    nodes). False: the deployment cannot move core roles; ``current`` is the effective
    split the caller maintains (core plus lent replicas) and an approved candidate is
    carried out by the elastic pool (desired = current + the candidate's extra training
    replicas, which may be negative)."""

    transition_cost_model: str = "fixed"
    """``fixed``: a move costs ``transition_cost_s``. ``recreated``: plus the current
    step time x the share of rollout devices the move re-creates (their in-flight turns
    restart: no KV transfer; ``Plan.rollout_share_recreated``) (issue 20, session 15).
    ``migrated``: plus the re-created share's weight load and the re-prefill of its
    in-flight contexts, what a move that migrates in-flight turns pays
    (``scheduling.planner.move_cost``; session 16)."""
    weight_load_bw_bytes_per_s: float = 0.0
    """Bandwidth at which a re-created rollout instance reads its weights (the
    ``migrated`` model's load term; 0: no load term)."""

    preflight_layouts: str = "any"
    """Layouts the preflight may adopt. ``any``: the reference's. ``homogeneous``: one
    TP degree only; a mixed layout waits for an online decision. A mix pays only through
    the length predictor, and the preflight's evidence is one step's startup profile: too
    small a sample of the tail to judge the predictor by (a twin replaying it cycles the
    same trajectories, so the predictor learns them by heart), while a homogeneous
    layout is routed by load whatever the lengths (issue 20, session 16)."""

    def __post_init__(self) -> None:
        if not isinstance(self.elastic_borrow_judged, bool):
            raise PlanError(
                f"elastic_borrow_judged: must be True or False, got {self.elastic_borrow_judged!r}"
            )
        if self.preflight_layouts not in PREFLIGHT_LAYOUTS:
            raise PlanError(
                f"preflight_layouts: must be one of {', '.join(PREFLIGHT_LAYOUTS)}, got "
                f"{self.preflight_layouts!r}"
            )
        if self.transition_cost_model not in TRANSITION_COST_MODELS:
            raise ValueError(
                f"transition_cost_model must be one of {', '.join(TRANSITION_COST_MODELS)}, "
                f"got {self.transition_cost_model!r}"
            )
        if self.plan_interval_steps <= 0:
            raise ValueError(
                f"plan_interval_steps must be positive, got {self.plan_interval_steps}"
            )
        if self.elastic_release_ratio >= self.elastic_borrow_ratio:
            raise ValueError(
                "elastic_release_ratio must be below elastic_borrow_ratio (hysteresis band), got "
                f"{self.elastic_release_ratio} >= {self.elastic_borrow_ratio}"
            )
        for name in (
            "cooldown_steps", "warmup_steps", "min_history_size", "elastic_ttl_steps",
            "elastic_reserve_gpus", "transition_cost_s", "min_gain_ratio",
            "elastic_dwell_steps", "weight_load_bw_bytes_per_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.elastic_span_alpha <= 1.0:
            raise ValueError(f"elastic_span_alpha must be in [0, 1], got {self.elastic_span_alpha}")
        if (
            isinstance(self.gain_horizon_steps, bool)
            or not isinstance(self.gain_horizon_steps, int)
            or self.gain_horizon_steps < 1
        ):
            raise ValueError(
                f"gain_horizon_steps must be an integer >= 1, got {self.gain_horizon_steps!r}"
            )
        if self.pipeline_depth < 1:
            raise ValueError(f"pipeline_depth must be >= 1, got {self.pipeline_depth}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMetrics:
    """What the job measured in one step."""

    step: int
    rollout_s: float
    train_s: float
    queue_pressure: float = 0.0
    active_pressure: float = 0.0
    rejected_total: int = 0
    hybrid_active: int = 0
    hybrid_joining: int = 0
    requests: tuple[RequestStats, ...] = ()
    """Trajectories finished this step (appended to the length history)."""
    requests_per_step: int = 0
    rollout_span_s: float | None = None
    """Release-to-completion time of this step's rollouts (``None``: not measured); the
    elastic trigger smooths it (``elastic_span_alpha``)."""
    in_flight_trajectories: int | None = None
    """Trajectories placed on rollout instances and not finished (the ``migrated`` move
    cost's in-flight count); ``None``: not measured (a full pipeline is assumed)."""
    elastic_capacity_replicas: int | None = None
    """Replicas the deployment can lend at most, reserve already deducted (``live``: the
    hybrid-capable workers); ``None``: ``(plan rollout devices - reserve) // replica``."""


@dataclass(slots=True)
class PlanEvent:
    """One planner decision, applied or not."""

    step: int
    fired: bool
    trigger: str
    applied: bool
    reason: str
    current: dict[str, Any] | None = None
    candidate: dict[str, Any] | None = None
    current_objective_s: float | None = None
    candidate_objective_s: float | None = None
    raw_gain_s: float = 0.0
    net_gain_s: float = 0.0
    transition_cost_s: float = 0.0
    """The modelled cost of the move (``PlannerConfig.transition_cost_model``)."""
    gain_ratio: float = 0.0
    inputs: dict[str, Any] = field(default_factory=dict)
    elastic: ElasticSignal | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record (infinite times become ``None``)."""
        out = asdict(self)
        for key in ("current_objective_s", "candidate_objective_s"):
            if out[key] is not None and math.isinf(out[key]):
                out[key] = None
        return out
