"""What the simulator reports to the planner at a step end (``StepMetrics``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from libra.types import InstanceLoad
from scheduling.planner import RequestStats, StepMetrics
from sim.trace import TraceTrajectory


def step_metrics(
    *,
    version: int,
    log: dict,
    trajectories: Sequence[TraceTrajectory],
    pinned_caps: Iterable[int],
    loads: Iterable[InstanceLoad],
    pending: int,
    rejected: int,
    hybrid_active: int,
    hybrid_joining: int,
    span_s: float | None,
) -> StepMetrics:
    """The step's times, pressures (over the live instances' pinned caps), length history
    and the release-to-completion span of its rollouts."""
    reqs = tuple(
        RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s) for t in trajectories
    )
    cap = sum(pinned_caps) or 1
    pinned = sum(load.active_trajectories for load in loads)
    return StepMetrics(
        step=version,
        rollout_s=log["rollout_s"],
        train_s=log["train_s"],
        queue_pressure=pending / cap,
        active_pressure=pinned / cap,
        rejected_total=rejected,
        hybrid_active=hybrid_active,
        hybrid_joining=hybrid_joining,
        requests=reqs,
        requests_per_step=len(reqs),
        rollout_span_s=span_s,
        in_flight_trajectories=pinned,
    )
