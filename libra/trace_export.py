"""The OpenTelemetry side of trajectory traces (``libra.tracing``'s port) and an exporter
that counts what it could not deliver.

:class:`OtelSpanSink` turns a :class:`libra.tracing.SpanRecord` into an SDK span with
explicit start and end times under a remote parent (the trajectory's traceparent). A
trajectory's root span must carry the ids chosen at admission, which the SDK only takes
from its id generator: the sink's tracer gets one that hands out forced ids for exactly
that one call.

:class:`CountingExporter` wraps the OTLP exporter: an export that fails (collector down
or unreachable) drops its spans, counts them in ``libra_trace_spans_dropped_total`` and
logs one warning per process; so do spans the batch processor drops because its queue
is full (exports stuck on a dead collector). The services never wait on it (the batch
processor exports from its own thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

from libra import metrics
from libra.tracing import SpanRecord, TraceParent

logger = logging.getLogger(__name__)

_MS_TO_NS = 1_000_000


class _ForcingIdGenerator(IdGenerator):
    """The tracer's own ids, except inside :meth:`forced` (one root span's start)."""

    def __init__(self, inner: IdGenerator) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._forced: TraceParent | None = None

    def generate_trace_id(self) -> int:
        return self._forced.trace_id if self._forced else self._inner.generate_trace_id()

    def generate_span_id(self) -> int:
        return self._forced.span_id if self._forced else self._inner.generate_span_id()

    def start_root(self, tracer: trace.Tracer, parent: TraceParent, span: SpanRecord
                   ) -> trace.Span:
        with self._lock:
            self._forced = parent
            try:
                return _start(tracer, span, Context())
            finally:
                self._forced = None


def _context_of(parent: TraceParent) -> Context:
    remote = SpanContext(parent.trace_id, parent.span_id, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED if parent.sampled else 0))
    return trace.set_span_in_context(NonRecordingSpan(remote), Context())


def _links(traceparents: Sequence[str]) -> list[Link]:
    links = []
    for text in traceparents:
        parent = TraceParent.parse(text)
        if parent is not None:
            links.append(Link(SpanContext(parent.trace_id, parent.span_id, is_remote=True,
                                          trace_flags=TraceFlags(TraceFlags.SAMPLED))))
    return links


def _start(tracer: trace.Tracer, span: SpanRecord, context: Context) -> trace.Span:
    return tracer.start_span(span.name, context=context, attributes=dict(span.attributes),
                             links=_links(span.links), start_time=span.start_ms * _MS_TO_NS)


class OtelSpanSink:
    """Records trajectory spans through an SDK tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("libra.trajectory")
        # The SDK tracer reads its id generator per span; this one can force the root's.
        self._ids = _ForcingIdGenerator(self._tracer.id_generator)  # type: ignore[attr-defined]
        self._tracer.id_generator = self._ids  # type: ignore[attr-defined]
        # Trajectory spans were sampled at admission (the port records only those) and
        # step or elastic spans are always kept: the provider's sampler is for gRPC and
        # Redis spans (by default only under a sampled caller), not for these.
        self._tracer.sampler = ParentBased(ALWAYS_ON)  # type: ignore[attr-defined]

    def record(self, span: SpanRecord) -> str:
        """A span under ``span.parent`` (or a new trace); its own traceparent."""
        parent = TraceParent.parse(span.parent) if span.parent else None
        started = _start(self._tracer, span, _context_of(parent) if parent else Context())
        return self._end(started, span)

    def record_root(self, traceparent: str, span: SpanRecord) -> None:
        """The span ``traceparent`` names, with exactly its ids (a trajectory's root)."""
        parent = TraceParent.parse(traceparent)
        if parent is not None:
            self._end(self._ids.start_root(self._tracer, parent, span), span)

    @staticmethod
    def _end(started: trace.Span, span: SpanRecord) -> str:
        if span.error:
            started.set_status(Status(StatusCode.ERROR, span.error))
        # A span never ends before it starts (clocks of two processes, rounding).
        started.end(end_time=max(span.end_ms, span.start_ms) * _MS_TO_NS)
        context = started.get_span_context()
        if not context.is_valid or not context.trace_flags.sampled:
            return ""
        return TraceParent(context.trace_id, context.span_id, True).format()


class DropCounter:
    """Counts dropped spans (``libra_trace_spans_dropped_total{service, reason}``) and
    warns once per process: the collector may be down for hours."""

    def __init__(self, service: str, endpoint: str) -> None:
        self._service = service
        self._endpoint = endpoint
        self._warned = False
        self.num_dropped = 0

    def dropped(self, num_spans: int, reason: str) -> None:
        """``num_spans`` were lost for ``reason`` (export_failed, queue_full)."""
        self.num_dropped += num_spans
        metrics.counter("libra_trace_spans_dropped").labels(self._service, reason).inc(
            num_spans)
        if not self._warned:
            self._warned = True
            logger.warning("[trace] spans dropped (%s): OTLP endpoint %s unreachable or "
                           "slow; counting them in libra_trace_spans_dropped_total and "
                           "warning only once", reason, self._endpoint)


class CountingExporter(SpanExporter):
    """Exports through ``inner``; a failed export's spans are counted as dropped."""

    def __init__(self, inner: SpanExporter, drops: DropCounter) -> None:
        self._inner = inner
        self._drops = drops

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the wrapped exporter; count a failed batch as dropped."""
        try:
            result = self._inner.export(spans)
        except Exception:  # noqa: BLE001 - an exporter bug must not stop the export thread
            logger.debug("[trace] exporter raised", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._drops.dropped(len(spans), "export_failed")
        return result

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped exporter."""
        return self._inner.force_flush(timeout_millis)


class CountingBatchProcessor(BatchSpanProcessor):
    """The SDK's batch processor, counting the spans it drops when its queue is full
    (exports stuck on a dead collector; the SDK only logs them)."""

    def __init__(self, exporter: SpanExporter, drops: DropCounter) -> None:
        super().__init__(exporter)
        self._drops = drops

    def on_end(self, span: ReadableSpan) -> None:
        """Queue the span; count it as dropped when the queue is full."""
        inner = getattr(self, "_batch_processor", None)  # SDK internals: count if present
        queue, size = getattr(inner, "_queue", None), getattr(inner, "_max_queue_size", 0)
        if queue is not None and span.context.trace_flags.sampled and len(queue) >= size:
            self._drops.dropped(1, "queue_full")
        super().on_end(span)


class QueueFullFilter(logging.Filter):
    """Silences the batch processor's "Queue full" warnings (repeated every 20 s while
    the collector is down): :class:`CountingBatchProcessor` counts those drops."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False (not logged) for a "Queue full" record."""
        return not str(record.msg).startswith("Queue full")


# One per process: the batch processor's logger is shared by every provider.
QUEUE_FULL = QueueFullFilter()
