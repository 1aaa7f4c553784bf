"""Observability of placement decisions: a Prometheus counter and span attributes.

Called by the servicer after the core decided, so every decision leaves
``libra_scheduler_decisions_total{reason,action}`` incremented and the RPC's current
span (the gRPC server span when tracing is on; a no-op span otherwise) carrying it:
``ReportToolReturn`` as ``libra.decision.*`` attributes of the span, and each decision
of a ``ToolReturns`` stream's batch as a ``libra.decision`` span event with those
attributes (plus ``libra.decision.count`` on the batch's span).

:class:`SchedulerCollector` reads each scheduled job's figures from the core at scrape
time: queue depth, groups drawn, migrations, idle instances while work waited, and live
bucket occupancy. Definitions live in libra/metrics.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import REGISTRY, Collector

from libra import metrics
from libra import types as t
from libra.step_timing import StepTimes
from services.scheduler.core import SchedulerCore

DECISIONS_TOTAL = metrics.counter("libra_scheduler_decisions_total")
TICK_SECONDS = metrics.histogram("libra_scheduler_tick_seconds")
TICK_OWN_SECONDS = metrics.histogram("libra_scheduler_tick_own_seconds")
TICK_CPU_SECONDS = metrics.histogram("libra_scheduler_tick_cpu_seconds")
DECIDE_BATCH_SECONDS = metrics.histogram("libra_scheduler_decide_batch_seconds")
REPORT_TICK_WAIT_SECONDS = metrics.histogram("libra_scheduler_report_tick_wait_seconds")


def observe_tick(wall_s: float, own: StepTimes) -> None:
    """One job's tick (the core calls it after every tick): wall time, and its own
    steps' wall and CPU time (libra/step_timing.py)."""
    TICK_SECONDS.observe(wall_s)
    TICK_OWN_SECONDS.observe(own.wall_s)
    TICK_CPU_SECONDS.observe(own.cpu_s)


def observe_decide_batch(seconds: float) -> None:
    """The time one batch of tool-return reports took to decide, fence included."""
    DECIDE_BATCH_SECONDS.observe(seconds)


def observe_tick_wait(seconds: float) -> None:
    """How long one report batch waited for a running tick's own steps (to its end,
    or its next Redis await) before it was decided (0 for most:
    ``SchedulerCore.tick_done``)."""
    REPORT_TICK_WAIT_SECONDS.observe(seconds)

ATTR_ACTION = "libra.decision.action"
ATTR_REASON = "libra.decision.reason"
ATTR_TARGET_BUCKET = "libra.decision.target_bucket"
ATTR_TARGET_INSTANCE = "libra.decision.target_instance"
ATTR_TRAJECTORY = "libra.trajectory_id"
ATTR_COUNT = "libra.decision.count"
EVENT_DECISION = "libra.decision"


# One labelled child per (reason, action), kept: ``labels()`` checks and locks at each
# call, several microseconds per decision on the report path.
_DECISION_COUNTERS: dict[tuple[str, str], Any] = {}


def _count_decision(decision: t.PlacementDecision) -> None:
    key = (decision.reason, decision.action.value)
    child = _DECISION_COUNTERS.get(key)
    if child is None:
        child = _DECISION_COUNTERS[key] = DECISIONS_TOTAL.labels(reason=key[0],
                                                                  action=key[1])
    child.inc()


def record_decision(trajectory_id: str, decision: t.PlacementDecision) -> None:
    """Count the decision and attach it to the current span."""
    _count_decision(decision)
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(_attributes(trajectory_id, decision))


def record_decisions(decisions: list[tuple[str, t.PlacementDecision]]) -> None:
    """Count every decision of a batch; each becomes an event on the current span."""
    for _trajectory_id, decision in decisions:
        _count_decision(decision)
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


class SchedulerCollector(Collector):
    """Reads ``SchedulerCore.gauges`` on each scrape (no store read)."""

    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    def collect(self) -> Iterator[Metric]:
        names = ("libra_scheduler_queued_trajectories", "libra_scheduler_groups_drawn",
                 "libra_scheduler_migrations", "libra_scheduler_idle_instances_while_queued",
                 "libra_scheduler_bucket_trajectories")
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for name in names:
            d = metrics.definition(name)
            kind = CounterMetricFamily if d.kind == "counter" else GaugeMetricFamily
            families[name] = kind(d.name, d.help, labels=list(d.labels))
        for g in self._core.gauges():
            families["libra_scheduler_queued_trajectories"].add_metric([g.job_id], g.queued)
            families["libra_scheduler_groups_drawn"].add_metric([g.job_id], g.groups_drawn)
            families["libra_scheduler_migrations"].add_metric([g.job_id], g.migrations)
            families["libra_scheduler_idle_instances_while_queued"].add_metric(
                [g.job_id], g.idle_while_queued)
            for bucket, count in sorted(g.bucket_trajectories.items()):
                families["libra_scheduler_bucket_trajectories"].add_metric(
                    [g.job_id, bucket], count)
        yield from families.values()


_registered: SchedulerCollector | None = None


def register(core: SchedulerCore) -> None:
    """Expose the core's jobs on the process's /metrics endpoint (the latest core's)."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = SchedulerCollector(core)
    REGISTRY.register(_registered)
