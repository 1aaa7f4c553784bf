"""The services' trajectory span sink (libra/otlp_spans.py): it records what the OTel SDK
adapter recorded (same spans, attributes, parents, links, statuses, times), only queues
on the caller's thread, and drops and counts instead of waiting. The transport is a
function given the encoded request; here it decodes with the official OTLP classes
(tests/otlp_memory.py); the real gRPC transport is tested in
tests/service/observability/test_otlp_span_export.py.
"""

from __future__ import annotations

import logging
import threading

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libra import tracing
from libra.otlp_spans import OtlpSpanSink
from libra.trace_export import DropCounter, OtelSpanSink
from libra.tracing import SpanRecord, TraceParent
from tests.otlp_memory import OtlpMemory


def a_trajectory_story() -> None:
    """Spans of one trajectory as the services record them, through the port."""
    parent = tracing.new_traceparent(sampled=True)
    tracing.record_child("scheduler.place", parent, 100, 120, **{
        "libra.to_bucket": "short", "libra.to_instance": "rollout-0"})
    tracing.record_child("rollout.generate", parent, 130, 400, **{
        "libra.turn": 1, "libra.tokens": 40, "libra.finish_reason": "tool_call"})
    tracing.record_child("tool.call", parent, 400, 380, **{  # ends "before" it starts
        "libra.tool": "python", "libra.latency_ms": 12.5, "libra.retries": 0})
    tracing.record_child("rollout.move", parent, 410, 420, error="refused: fenced",
                         **{"libra.to_bucket": "long", "libra.ok": False})
    step = tracing.record_span("trainer.step", 500, 900, links=[parent], **{
        "libra.step": 3})
    tracing.record_child("trainer.train", parent, 500, 900, links=[step], **{
        "libra.step": 3, "libra.staleness": 1})
    tracing.end_trajectory(parent, 100, 900, "trained", links=[step], **{
        "libra.reward": 1.0})
    tracing.record_event("elastic.plan", 950, {"job_id": "j", "inputs": {"a": [1, 2]}})


def shape(spans: tuple[ReadableSpan, ...]) -> list[tuple]:
    """What a trace viewer shows, ids replaced by the names of the spans they point at."""
    by_id = {s.context.span_id: s.name for s in spans}
    traces = {s.context.trace_id for s in spans}
    return sorted((
        s.name, s.start_time, s.end_time, dict(s.attributes or {}),
        by_id.get(s.parent.span_id) if s.parent else None,
        s.parent is not None and s.parent.trace_id == s.context.trace_id,
        tuple(by_id.get(link.context.span_id) for link in s.links),
        s.status.status_code.name, s.status.description) for s in spans) + [len(traces)]


def test_it_records_what_the_sdk_adapter_recorded() -> None:
    sdk_memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sdk_memory))
    otlp_memory = OtlpMemory()
    try:
        tracing.set_sink(OtelSpanSink(provider))
        a_trajectory_story()
        tracing.set_sink(otlp_memory.sink)
        a_trajectory_story()
    finally:
        tracing.set_sink(None)
        otlp_memory.sink.shutdown()
    expected = shape(sdk_memory.get_finished_spans())
    assert len(expected) == 9  # 8 spans, 3 traces (the trajectory, the step, the event)
    assert shape(otlp_memory.get_finished_spans()) == expected
    [request] = otlp_memory.requests  # one batch, the resource once
    assert [a.key for a in request.resource_spans[0].resource.attributes] == ["service.name"]


def test_unsampled_malformed_and_root_less_parents() -> None:
    memory = OtlpMemory()
    sink = memory.sink
    try:
        unsampled = tracing.new_traceparent(sampled=False)
        assert sink.record(SpanRecord("x", unsampled, 0, 1)) == ""
        sink.record_root("not-a-traceparent", SpanRecord("trajectory", "", 0, 1))
        assert memory.get_finished_spans() == ()
        malformed = "00-" + "z" * 32 + "-" + "1" * 16 + "-01"  # the right length, not hex
        sink.record(SpanRecord("orphan", malformed, 0, 1))
        [orphan] = memory.get_finished_spans()
        assert orphan.parent is None and orphan.context.is_valid  # a trace of its own
    finally:
        sink.shutdown()


def test_a_full_queue_drops_and_counts_and_recording_never_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    taken = threading.Event()
    exported: list[int] = []

    def stuck_collector(request: bytes, timeout_s: float) -> None:
        taken.set()
        release.wait()
        exported.append(sum(len(scope.spans) for res in ExportTraceServiceRequest.FromString(
            request).resource_spans for scope in res.scope_spans))

    drops = DropCounter("otlp-sink-unit", "stuck:4317")
    sink = OtlpSpanSink(stuck_collector, {"service.name": "t"}, drops,
                        max_queue_spans=1000, batch_size=100, export_interval_s=3600)
    parent = tracing.new_traceparent(sampled=True)
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(100):  # one batch: wakes the export thread, which then hangs
                sink.record(SpanRecord(f"span-{i}", parent, 0, 1))
            assert taken.wait(timeout=30)
            # The thread holds one batch and hangs: these all return while it does.
            for i in range(100, 3000):
                assert TraceParent.parse(sink.record(SpanRecord(f"span-{i}", parent, 0, 1)))
            assert drops.num_dropped == 1900  # the queue holds 1,000 of the 2,900
            release.set()
            sink.shutdown()
    finally:
        release.set()
        sink.shutdown()
    assert sum(exported) == 1000 + 100 and sum(exported) + drops.num_dropped == 3000
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "[trace] spans dropped (queue_full): OTLP endpoint stuck:4317 unreachable or slow; "
        "counting them in libra_trace_spans_dropped_total and warning only once"]


def test_a_failed_export_drops_its_batch_counted_and_the_next_goes_out() -> None:
    outcomes = [ConnectionError("collector down"), None]
    delivered: list[bytes] = []

    def flaky_collector(request: bytes, timeout_s: float) -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome
        delivered.append(request)

    drops = DropCounter("otlp-sink-unit-flaky", "flaky:4317")
    sink = OtlpSpanSink(flaky_collector, {}, drops, batch_size=10, export_interval_s=3600)
    parent = tracing.new_traceparent(sampled=True)
    try:
        for _ in range(2):
            for i in range(5):
                sink.record(SpanRecord(f"span-{i}", parent, 0, 1))
            sink.force_flush()
    finally:
        sink.shutdown()
    assert drops.num_dropped == 5 and sink.num_exported == 5 and len(delivered) == 1


def test_the_export_thread_sends_a_full_batch_without_a_flush() -> None:
    delivered = threading.Event()
    sink = OtlpSpanSink(lambda request, timeout_s: delivered.set(), {},
                        DropCounter("otlp-sink-unit-batch", "x"), batch_size=50,
                        export_interval_s=3600)
    parent = tracing.new_traceparent(sampled=True)
    try:
        for i in range(50):
            sink.record(SpanRecord(f"span-{i}", parent, 0, 1))
        assert delivered.wait(timeout=30)  # the 50th span woke the thread
    finally:
        sink.shutdown()
    assert sink.num_exported == 50


def test_shutdown_exports_what_is_queued() -> None:
    memory = OtlpMemory()
    parent = tracing.new_traceparent(sampled=True)
    for i in range(3):
        memory.sink.record(SpanRecord(f"span-{i}", parent, 0, 1))
    memory.sink.shutdown()
    assert memory.sink.num_exported == 3 and len(memory.requests) == 1
