"""Observability of placement decisions: a Prometheus counter and span attributes.

Called by the servicer after the core decided, so every decision leaves
``libra_scheduler_decisions_total{reason,action}`` incremented and the RPC's current
span (the gRPC server span when tracing is on; a no-op span otherwise) carrying it:
``ReportToolReturn`` as ``libra.decision.*`` attributes of the span, and each decision
of a ``ToolReturns`` stream's batch as a ``libra.decision`` span event with those
attributes (plus ``libra.decision.count`` on the batch's span).
"""

from __future__ import annotations

from opentelemetry import trace

from libra import metrics
from libra import types as t

DECISIONS_TOTAL = metrics.counter("libra_scheduler_decisions_total")

ATTR_ACTION = "libra.decision.action"
ATTR_REASON = "libra.decision.reason"
ATTR_TARGET_BUCKET = "libra.decision.target_bucket"
ATTR_TARGET_INSTANCE = "libra.decision.target_instance"
ATTR_TRAJECTORY = "libra.trajectory_id"
ATTR_COUNT = "libra.decision.count"
EVENT_DECISION = "libra.decision"


def record_decision(trajectory_id: str, decision: t.PlacementDecision) -> None:
    """Count the decision and attach it to the current span."""
    DECISIONS_TOTAL.labels(reason=decision.reason, action=decision.action.value).inc()
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(_attributes(trajectory_id, decision))


def record_decisions(decisions: list[tuple[str, t.PlacementDecision]]) -> None:
    """Count every decision of a batch; each becomes an event on the current span."""
    for _trajectory_id, decision in decisions:
        DECISIONS_TOTAL.labels(reason=decision.reason, action=decision.action.value).inc()
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute(ATTR_COUNT, len(decisions))
    for trajectory_id, decision in decisions:
        span.add_event(EVENT_DECISION, _attributes(trajectory_id, decision))


def _attributes(trajectory_id: str, decision: t.PlacementDecision) -> dict[str, str]:
    return {
        ATTR_TRAJECTORY: trajectory_id,
        ATTR_ACTION: decision.action.value,
        ATTR_REASON: decision.reason,
        ATTR_TARGET_BUCKET: decision.target_bucket,
        ATTR_TARGET_INSTANCE: decision.target_instance,
    }
