"""Prometheus view of the gateway's tool lanes, read from the core at scrape time.

``libra_tool_calls_running{tool}`` and ``libra_tool_calls_waiting{tool}`` are the calls
holding a slot and waiting for one right now; ``libra_tool_slots{tool}`` is the limit.
A collector (not gauges set on every change) keeps the core free of metrics code.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from services.toolgateway.core import ToolGatewayCore


class ToolLaneCollector(Collector):
    """Reads ``ToolGatewayCore.lane_stats`` on each scrape."""

    def __init__(self, core: ToolGatewayCore) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily("libra_tool_calls_running",
                                    "Tool calls holding a slot now", labels=["tool"])
        waiting = GaugeMetricFamily("libra_tool_calls_waiting",
                                    "Tool calls waiting for a slot now", labels=["tool"])
        slots = GaugeMetricFamily("libra_tool_slots", "Concurrent calls allowed per tool",
                                  labels=["tool"])
        for lane in self._core.lane_stats():
            running.add_metric([lane.tool], lane.num_running)
            waiting.add_metric([lane.tool], lane.num_waiting)
            slots.add_metric([lane.tool], lane.limit)
        yield from (running, waiting, slots)


_registered: ToolLaneCollector | None = None


def register(core: ToolGatewayCore) -> None:
    """Expose the core's lanes on the process's /metrics endpoint (the latest core's,
    when a process serves more than one in turn)."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = ToolLaneCollector(core)
    REGISTRY.register(_registered)
