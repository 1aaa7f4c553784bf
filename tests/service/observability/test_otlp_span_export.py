"""Trajectory spans over real OTLP/gRPC (``libra.telemetry.build_span_sink``, the services'
path): a collector's TraceService in this process receives them, batched, with the
service's resource; an endpoint nobody listens on drops and counts them, warns once, and
recording goes on.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc
from prometheus_client import REGISTRY

from libra import telemetry, tracing
from libra.service_config import TelemetryConfig
from libra.tracing import TraceParent
from tests.otlp_memory import serving_collector


class Collector(pb_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[pb.ExportTraceServiceRequest] = []

    def Export(self, request, context):  # noqa: N802, ANN001
        self.requests.append(request)
        return pb.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    servicer = Collector()
    with serving_collector(servicer) as address:
        yield servicer, address


def test_a_trajectory_reaches_the_collector_as_one_tree(
        collector: tuple[Collector, str]) -> None:
    received, endpoint = collector
    sink = telemetry.build_span_sink("rollout-7", TelemetryConfig(otlp_endpoint=endpoint))
    assert sink is not None
    tracing.set_sink(sink)
    parent = tracing.new_traceparent(sampled=True)
    root = TraceParent.parse(parent)
    assert root is not None
    try:
        for turn in range(1, 601):  # more than one batch (512)
            tracing.record_child("rollout.generate", parent, turn, turn + 1,
                                 **{"libra.turn": turn})
        tracing.end_trajectory(parent, 0, 700, "trained")
        assert sink.force_flush()
    finally:
        tracing.set_sink(None)
        sink.shutdown()
    assert len(received.requests) == 2
    spans = []
    for request in received.requests:
        [resource_spans] = request.resource_spans
        attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        assert attributes["service.name"] == "rollout-7"
        assert attributes["telemetry.sdk.name"] == "opentelemetry"  # the SDK's resource
        spans += [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert len(spans) == 601
    root_id = root.span_id.to_bytes(8, "big")
    [traj] = [s for s in spans if s.name == "trajectory"]
    assert traj.span_id == root_id and not traj.parent_span_id
    children = [s for s in spans if s.name == "rollout.generate"]
    assert {s.trace_id for s in spans} == {root.trace_id.to_bytes(16, "big")}
    assert {s.parent_span_id for s in children} == {root_id}
    assert sorted(s.attributes[0].value.int_value for s in children) == list(range(1, 601))


def closed_port() -> int:
    """A loopback port that was free a moment ago (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_collector_drops_counts_and_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(telemetry, "OTLP_EXPORT_TIMEOUT_S", 0.5)
    service = "otlp-sink-down"
    sink = telemetry.build_span_sink(
        service, TelemetryConfig(otlp_endpoint=f"127.0.0.1:{closed_port()}"))
    assert sink is not None

    def dropped() -> float:
        return REGISTRY.get_sample_value("libra_trace_spans_dropped_total",
                                         {"service": service, "reason": "export_failed"}) or 0.0

    parent = tracing.new_traceparent(sampled=True)
    try:
        with caplog.at_level(logging.WARNING):
            for batch in range(2):
                for i in range(1500):
                    made = sink.record(tracing.SpanRecord(f"span-{batch}-{i}", parent, 0, 1))
                    assert TraceParent.parse(made) is not None  # recording goes on
                assert not sink.force_flush()
    finally:
        sink.shutdown()
    assert dropped() == 3000
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "libra_trace_spans_dropped_total" in warnings[0], warnings
