"""Trajectory spans through the services' real export path, kept in memory for tests.

:class:`OtlpMemory` is an ``InMemorySpanExporter`` fed by a real
:class:`libra.otlp_spans.OtlpSpanSink`: spans are queued, encoded to OTLP bytes
(``libra.otlp_wire``), decoded with the official ``opentelemetry.proto`` classes and
turned back into SDK ``ReadableSpan`` objects, so tests written against the SDK's span
model (name, context, parent, attributes, links, status, times) check what a collector
receives. Reading the spans exports what is queued first (the sink's thread would only
after its interval).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, StatusCode, TraceFlags
from opentelemetry.trace import Status as SdkStatus

from libra.otlp_spans import OtlpSpanSink
from libra.trace_export import DropCounter


class OtlpMemory(InMemorySpanExporter):
    """The spans an :class:`OtlpSpanSink` exported, as SDK spans (see the module doc)."""

    def __init__(self, service: str = "test") -> None:
        super().__init__()
        self.requests: list[ExportTraceServiceRequest] = []
        # An interval nobody waits for: spans are exported when the test reads them.
        self.sink = OtlpSpanSink(self._receive, {"service.name": service},
                                 DropCounter(service, "memory"), export_interval_s=3600)

    def _receive(self, request: bytes, timeout_s: float) -> None:
        decoded = ExportTraceServiceRequest.FromString(request)
        self.requests.append(decoded)
        for resource_spans in decoded.resource_spans:
            resource = Resource({kv.key: value_of(kv.value)
                                 for kv in resource_spans.resource.attributes})
            for scope in resource_spans.scope_spans:
                self.export([readable(span, resource) for span in scope.spans])

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        """Every span recorded so far (what was queued is exported first)."""
        self.sink.force_flush()
        return super().get_finished_spans()


def value_of(value: AnyValue) -> str | bool | int | float:
    """An attribute's value."""
    return getattr(value, value.WhichOneof("value"))


def readable(span: Span, resource: Resource) -> ReadableSpan:
    """The SDK span a received OTLP span stands for."""
    def context(trace_id: bytes, span_id: bytes, remote: bool) -> SpanContext:
        return SpanContext(int.from_bytes(trace_id, "big"), int.from_bytes(span_id, "big"),
                           is_remote=remote, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    status = SdkStatus(StatusCode.UNSET)
    if span.status.code == Status.STATUS_CODE_ERROR:
        status = SdkStatus(StatusCode.ERROR, span.status.message)
    return ReadableSpan(
        name=span.name, context=context(span.trace_id, span.span_id, False),
        parent=(context(span.trace_id, span.parent_span_id, True)
                if span.parent_span_id else None),
        resource=resource,
        attributes={kv.key: value_of(kv.value) for kv in span.attributes},
        links=[Link(context(link.trace_id, link.span_id, True)) for link in span.links],
        status=status, start_time=span.start_time_unix_nano,
        end_time=span.end_time_unix_nano)


@contextmanager
def serving_collector(servicer: TraceServiceServicer, workers: int = 2) -> Iterator[str]:
    """``servicer`` as an OTLP trace collector on a loopback port; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
