"""Trajectory spans straight to OTLP: the cheap path of ``libra.tracing``'s port.

A traced trajectory makes 6-9 spans, and the OpenTelemetry SDK spent ~55 us of CPU on
each (an SDK span object with its attribute checks, then the exporter's encoding of it):
on a tiny model that was 5-9% of the job. Here :meth:`OtlpSpanSink.record` does a small,
constant amount of work on the caller's thread (a random span id, one string, one deque
append) and a background thread, every ``export_interval_s`` or when ``batch_size`` spans
wait, encodes the batch straight into an OTLP ``ExportTraceServiceRequest`` (the resource
once per batch, ids as bytes, no SDK span objects) and sends it with the OTLP gRPC stub.

Never blocking: the queue is bounded; a span arriving while it is full is dropped, as is
a batch whose export fails (collector down, unreachable, slow past ``timeout_s``); both
are counted by :class:`libra.trace_export.DropCounter`, which warns once per process.
The OTel SDK stays for what is not per trajectory (gRPC and Redis auto-instrumentation).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from libra import otlp_wire
from libra.otlp_config import OtlpSettings
from libra.trace_export import DropCounter
from libra.tracing import AttributeValue, SpanRecord, parse_traceparent

logger = logging.getLogger(__name__)

_MS_TO_NS = 1_000_000
_SCOPE = "libra.trajectory"
# A traceparent is "00-" + 32 hex trace id + "-" + 16 hex span id + "-" + 2 hex flags.
_TRACE_ID = slice(3, 35)
_SPAN_ID = slice(36, 52)
_PREFIX_LEN = 36
_TRACEPARENT_LEN = 55
_ODD_HEX = frozenset("13579bdf")

# What the export thread sends a batch with: an encoded ExportTraceServiceRequest, and
# its deadline in seconds.
Send = Callable[[bytes, float], None]

# One queued span: the record, its own traceparent, and whether its parent is remote.
_Queued = tuple[SpanRecord, str, bool]

_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class OtlpSpanSink:
    """A :class:`libra.tracing.SpanSink` that batches finished spans into OTLP requests
    on a thread of its own. ``send`` raises when a batch was not delivered."""

    def __init__(self, send: Send, resource_attributes: Mapping[str, AttributeValue],
                 drops: DropCounter, *, max_queue_spans: int = 8192,
                 batch_size: int = 512, export_interval_s: float = 2.0,
                 timeout_s: float = 5.0) -> None:
        self._send = send
        self._resource = otlp_wire.resource(resource_attributes)
        self._drops = drops
        self._max_queue_spans = max_queue_spans
        self._batch_size = batch_size
        self._interval_s = export_interval_s
        self._timeout_s = timeout_s
        self._queue: deque[_Queued] = deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()  # the thread's exports and force_flush's
        self._stopped = False
        self.num_exported = 0
        self.export_cpu_s = 0.0  # the export thread's own CPU (gRPC's threads excluded)
        self._thread = threading.Thread(target=self._run, name="libra-otlp-spans",
                                        daemon=True)
        self._thread.start()

    # -- the caller's side: constant work, never waits ------------------------------------

    def record(self, span: SpanRecord) -> str:
        """Queue ``span`` under ``span.parent`` (or as a new trace); its own traceparent,
        "" under an unsampled parent."""
        parent = span.parent
        if len(parent) == _TRACEPARENT_LEN:  # else "" or malformed: a trace of its own
            if parent[-1] not in _ODD_HEX:  # the sampled flag is bit 0
                return ""
            own = f"{parent[:_PREFIX_LEN]}{random.getrandbits(64) or 1:016x}-01"
        else:
            own = (f"00-{random.getrandbits(128) or 1:032x}-"
                   f"{random.getrandbits(64) or 1:016x}-01")
        self._put((span, own, len(parent) == _TRACEPARENT_LEN))
        return own

    def record_root(self, traceparent: str, span: SpanRecord) -> None:
        """Queue ``span`` as the span ``traceparent`` names (a trajectory's root)."""
        if parse_traceparent(traceparent) is not None:  # once per trajectory
            self._put((span, traceparent, False))

    def _put(self, item: _Queued) -> None:
        queue = self._queue
        if len(queue) >= self._max_queue_spans:
            self._drops.dropped(1, "queue_full")
            return
        queue.append(item)  # deque.append is atomic: no lock with the export thread
        if len(queue) >= self._batch_size:
            self._wake.set()

    # -- the export thread ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            started_s = time.thread_time()
            self._export_queued()
            self.export_cpu_s += time.thread_time() - started_s

    def _export_queued(self) -> None:
        with self._export_lock:
            while self._queue:
                batch = [self._queue.popleft()
                         for _ in range(min(self._batch_size, len(self._queue)))]
                try:
                    self._send(self.encode(batch), self._timeout_s)
                    self.num_exported += len(batch)
                except Exception:  # noqa: BLE001 - any failure drops the batch, counted
                    logger.debug("[trace] OTLP export failed", exc_info=True)
                    self._drops.dropped(len(batch), "export_failed")

    def encode(self, batch: Sequence[_Queued]) -> bytes:
        """The OTLP ExportTraceServiceRequest for ``batch``: one resource, one scope."""
        return otlp_wire.export_request(self._resource, _SCOPE, [
            _encode(span, own, remote_parent) for span, own, remote_parent in batch])

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every queued span now (on the caller's thread); False when a batch
        failed to export. ``timeout_millis`` is accepted for the SDK's signature: each
        batch has its own ``timeout_s``."""
        before = self._drops.num_dropped
        self._export_queued()
        return self._drops.num_dropped == before

    def shutdown(self) -> None:
        """Stop the export thread after one last export of what is queued."""
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=self._timeout_s * 2)
        self._export_queued()


def _encode(span: SpanRecord, own: str, remote_parent: bool) -> bytes:
    parent = parse_traceparent(span.parent) if remote_parent else None
    if remote_parent and parent is None:  # a malformed parent: a trace of its own
        trace_id, span_id = random.getrandbits(128) or 1, random.getrandbits(64) or 1
    else:
        trace_id, span_id = int(own[_TRACE_ID], 16), int(own[_SPAN_ID], 16)
    links = [(linked.trace_id.to_bytes(16, "big"), linked.span_id.to_bytes(8, "big"))
             for linked in map(parse_traceparent, span.links) if linked is not None]
    return otlp_wire.span(
        trace_id.to_bytes(16, "big"), span_id.to_bytes(8, "big"),
        parent.span_id.to_bytes(8, "big") if parent is not None else None, span.name,
        span.start_ms * _MS_TO_NS,
        # A span never ends before it starts (clocks of two processes, rounding).
        max(span.end_ms, span.start_ms) * _MS_TO_NS, span.attributes, links, span.error)


def grpc_sender(settings: OtlpSettings) -> tuple[Send, Callable[[], None]]:
    """Sends OTLP requests as ``settings`` say (target, TLS roots and client
    certificate, headers as gRPC metadata, gzip) over one gRPC channel; and the
    channel's close."""
    import grpc

    compression = grpc.Compression.Gzip if settings.gzip else grpc.Compression.NoCompression
    if settings.tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=settings.ca_pem or None,
            private_key=settings.client_key_pem or None,
            certificate_chain=settings.client_cert_pem or None)
        channel = grpc.secure_channel(settings.target, credentials, compression=compression)
    else:
        channel = grpc.insecure_channel(settings.target, compression=compression)
    # The request is already encoded: bytes pass through (no request serializer).
    export = channel.unary_unary(_EXPORT_METHOD, request_serializer=None,
                                 response_deserializer=None)
    metadata = settings.headers or None

    def send(request: bytes, timeout_s: float) -> None:
        export(request, timeout=timeout_s, metadata=metadata)

    return send, channel.close
