"""An OTLP endpoint that is down: spans are dropped and counted, one warning is logged,
and recording spans goes on (the service never waits on the exporter).

Real: the OTLP gRPC exporter behind ``libra.telemetry.build_provider`` (its batch
processor and the counting wrapper), aimed at a loopback port nobody listens on; the
Prometheus counter in the process's registry.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import REGISTRY

from libra import telemetry
from libra.service_config import TelemetryConfig
from libra.trace_export import QUEUE_FULL, CountingBatchProcessor, DropCounter, OtelSpanSink
from libra.tracing import SpanRecord, TraceParent, new_traceparent

SERVICE = "trace-down-test"


def closed_port() -> int:
    """A loopback port that was free a moment ago (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("libra_trace_spans_dropped_total",
                                     {"service": SERVICE, "reason": reason}) or 0.0


def num_dropped() -> float:
    return dropped("export_failed") + dropped("queue_full")


def test_unreachable_endpoint_drops_and_counts_spans_and_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A refused connection is retried after 1 s; a deadline under that gives up at once.
    monkeypatch.setattr(telemetry, "OTLP_EXPORT_TIMEOUT_S", 0.5)
    provider = telemetry.build_provider(
        SERVICE, TelemetryConfig(otlp_endpoint=f"127.0.0.1:{closed_port()}"))
    assert provider is not None
    sink = OtelSpanSink(provider)
    before = num_dropped()
    parent = new_traceparent(sampled=True)
    try:
        with caplog.at_level(logging.WARNING):
            # More than the batch processor's queue (2,048): whether the export thread
            # keeps up or the queue overflows, every span is lost one way or the other.
            for batch in range(2):
                for i in range(1500):
                    # Recording goes on while the collector is away.
                    made = sink.record(SpanRecord(f"span-{batch}-{i}", parent, 0, 1))
                    assert TraceParent.parse(made) is not None
                assert provider.force_flush(timeout_millis=60_000)
    finally:
        provider.shutdown()
    assert num_dropped() - before == 3000
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "spans dropped" in warnings[0].getMessage()
    assert "libra_trace_spans_dropped_total" in warnings[0].getMessage()


def test_a_full_queue_counts_its_drops_and_the_sdk_warning_is_silenced(
        caplog: pytest.LogCaptureFixture) -> None:
    exported: list[int] = []
    release = threading.Event()

    class StuckExporter(SpanExporter):
        """A collector that hangs until released (then accepts)."""

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            release.wait()
            exported.append(len(spans))
            return SpanExportResult.SUCCESS

    drops = DropCounter(SERVICE, "stuck:4317")
    processor = CountingBatchProcessor(StuckExporter(), drops)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    logging.getLogger("opentelemetry.sdk._shared_internal").addFilter(QUEUE_FULL)
    sink = OtelSpanSink(provider)
    parent = new_traceparent(sampled=True)
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(3000):
                sink.record(SpanRecord(f"span-{i}", parent, 0, 1))
            release.set()
            assert provider.force_flush(timeout_millis=60_000)
    finally:
        release.set()
        provider.shutdown()
    # Whatever the export thread had taken before it hung, the rest beyond the queue's
    # 2,048 were dropped, counted, and nothing is lost silently.
    assert drops.num_dropped > 0
    assert sum(exported) + drops.num_dropped == 3000
    assert [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "dropped" in r.getMessage()] == [
        "[trace] spans dropped (queue_full): OTLP endpoint stuck:4317 unreachable or slow; "
        "counting them in libra_trace_spans_dropped_total and warning only once"]
    assert not [r for r in caplog.records if "Queue full" in r.getMessage()]
