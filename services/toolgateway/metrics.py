"""Prometheus view of the gateway's tool lanes, read from the core at scrape time.

``libra_tool_calls_running{tool}`` and ``libra_tool_calls_waiting{tool}`` are the calls
holding a slot and waiting for one right now; ``libra_tool_slots{tool}`` is the limit.
``libra_tool_calls_total{tool,status}`` and ``libra_tool_call_seconds{tool}`` count and
time finished calls. Definitions live in libra/metrics.py. A collector (not gauges set
on every change) keeps the core free of metrics code.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from libra import metrics
from libra import types as t
from services.toolgateway.core import ToolGatewayCore


class ToolLaneCollector(Collector):
    """Reads ``ToolGatewayCore.lane_stats`` on each scrape."""

    def __init__(self, core: ToolGatewayCore) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running, waiting, slots = (_family(name) for name in (
            "libra_tool_calls_running", "libra_tool_calls_waiting", "libra_tool_slots"))
        for lane in self._core.lane_stats():
            running.add_metric([lane.tool], lane.num_running)
            waiting.add_metric([lane.tool], lane.num_waiting)
            slots.add_metric([lane.tool], lane.limit)
        yield from (running, waiting, slots)


def _family(name: str) -> GaugeMetricFamily:
    d = metrics.definition(name)
    return GaugeMetricFamily(d.name, d.help, labels=list(d.labels))


def record_call(tool: str, result: t.ToolResult) -> None:
    """Count a finished call by tool and status and observe its latency (the servicer
    calls this after the core answered). Only a registered tool gets this far (the core
    raises UnknownTool first), so the label stays bounded whatever callers send."""
    metrics.counter("libra_tool_calls_total").labels(tool, result.status.value).inc()
    metrics.histogram("libra_tool_call_seconds").labels(tool).observe(
        result.latency_ms / 1000.0)


_registered: ToolLaneCollector | None = None


def register(core: ToolGatewayCore) -> None:
    """Expose the core's lanes on the process's /metrics endpoint (the latest core's,
    when a process serves more than one in turn)."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = ToolLaneCollector(core)
    REGISTRY.register(_registered)
