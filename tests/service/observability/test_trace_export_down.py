"""An OTLP endpoint that is down: spans are dropped and counted, one warning is logged,
and recording spans goes on (the service never waits on the exporter).

Real: the OTLP gRPC exporter behind ``libra.telemetry.build_provider`` (its batch
processor and the counting wrapper), aimed at a loopback port nobody listens on; the
Prometheus counter in the process's registry.
"""

from __future__ import annotations

import logging
import socket

import pytest
from prometheus_client import REGISTRY

from libra import telemetry
from libra.service_config import TelemetryConfig
from libra.trace_export import OtelSpanSink
from libra.tracing import SpanRecord, TraceParent, new_traceparent

SERVICE = "trace-down-test"


def closed_port() -> int:
    """A loopback port that was free a moment ago (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dropped() -> float:
    return REGISTRY.get_sample_value("libra_trace_spans_dropped_total",
                                     {"service": SERVICE, "reason": "export_failed"}) or 0.0


def test_unreachable_endpoint_drops_and_counts_spans_and_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # One retry (1 s backoff), then the export gives up: keeps the test short.
    monkeypatch.setattr(telemetry, "OTLP_EXPORT_TIMEOUT_S", 1.5)
    provider = telemetry.build_provider(
        SERVICE, TelemetryConfig(otlp_endpoint=f"127.0.0.1:{closed_port()}"))
    assert provider is not None
    sink = OtelSpanSink(provider)
    before = dropped()
    parent = new_traceparent(sampled=True)
    try:
        with caplog.at_level(logging.WARNING):
            for batch in range(2):
                for i in range(5):
                    # Recording goes on while the collector is away.
                    made = sink.record(SpanRecord(f"span-{batch}-{i}", parent, 0, 1))
                    assert TraceParent.parse(made) is not None
                assert provider.force_flush(timeout_millis=30_000)
    finally:
        provider.shutdown()
    assert dropped() - before == 10
    warnings = [r for r in caplog.records
                if r.levelno >= logging.WARNING and "spans dropped" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "libra_trace_spans_dropped_total" in warnings[0].getMessage()
    # The exporter's own per-batch errors are silenced (they would repeat for hours).
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
