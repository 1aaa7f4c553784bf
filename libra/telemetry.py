"""One telemetry setup for every service: logs, traces and Prometheus metrics.

Traces: spans are exported over OTLP when an endpoint is configured (``telemetry.
otlp_endpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables, libra/otlp_config.py), or to
the console when asked. Only then is the SDK tracer provider installed; otherwise the
API's no-op provider stays, so a span nobody reads costs no more than a function call (a
recording span with its events and attributes costs tens of microseconds, per batch of
decisions or per turn). gRPC (context carried in metadata across services) and Redis
are instrumented only when ``OTEL_TRACES_SAMPLER`` is set, and their spans sampled as it
says: as traces of their own they were most of tracing's cost and none of a
trajectory's story, and a patched call costs CPU even when it records nothing.
Configure the exporter on every service together, or the trace breaks at a service
that does not export.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import os
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from libra import otlp_config, tracing
from libra.log_hygiene import RepeatLimiter, SafeMessages
from libra.otlp_spans import OtlpSpanSink, grpc_sender
from libra.service_config import TelemetryConfig
from libra.trace_export import (
    QUEUE_FULL,
    CountingBatchProcessor,
    CountingExporter,
    DropCounter,
    OtelSpanSink,
)

_instrumented = False
# One per (service, endpoint): the SDK's exporter and the trajectory span sink share it,
# so a collector that is down is warned about once per process.
_drop_counters: dict[tuple[str, str], DropCounter] = {}
# One OTLP export's deadline, retries included (the SDK default is 10 s): while the
# collector is down the export thread gives a batch up sooner, so fewer spans wait.
OTLP_EXPORT_TIMEOUT_S = 5.0


class _JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname.lower(),
            "service": self._service, "logger": record.name, "msg": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            entry["trace_id"] = f"{span.trace_id:032x}"
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def init_logging(service: str, cfg: TelemetryConfig) -> None:
    """Configure the root logger once per process (text key=value or JSON lines).

    Every record is escaped, clipped and rate-limited (libra/log_hygiene.py); with
    ``log_file`` the lines go to that file, rotated by size, instead of stderr.
    """
    handler = _handler(cfg)
    if cfg.log_json:
        handler.setFormatter(_JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s level=%(levelname)s service={service} logger=%(name)s %(message)s"))
    # The limiter keys on the message template, so it runs before the message is rendered.
    handler.addFilter(RepeatLimiter(cfg.log_repeat_burst, cfg.log_repeat_window_s))
    handler.addFilter(SafeMessages(cfg.log_max_message_chars))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level.upper())
    logging.Formatter.converter = time.gmtime
    sys.excepthook = _log_uncaught


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """A crash's traceback goes to the service's log too, not only to stderr."""
    logging.getLogger("uncaught").critical("process ends on %s", exc_type.__name__,
                                           exc_info=(exc_type, exc, tb))
    sys.__excepthook__(exc_type, exc, tb)


def _handler(cfg: TelemetryConfig) -> logging.Handler:
    if not cfg.log_file:
        return logging.StreamHandler(sys.stderr)
    Path(cfg.log_file).parent.mkdir(parents=True, exist_ok=True)
    return logging.handlers.RotatingFileHandler(
        cfg.log_file, maxBytes=cfg.log_max_bytes, backupCount=cfg.log_backup_count,
        encoding="utf-8")


def init_tracing(service: str, cfg: TelemetryConfig,
                 extra_processor: SpanProcessor | None = None) -> TracerProvider | None:
    """Install the tracer provider when spans go somewhere, and instrument gRPC (client
    and server) and Redis when ``OTEL_TRACES_SAMPLER`` asks for their spans; None (the
    no-op provider stays) when nothing exports or ``OTEL_SDK_DISABLED`` is true.

    Raises:
        InvalidArgument: an ``OTEL_*`` variable with a bad value, naming it.
    """
    if otlp_config.sdk_disabled(os.environ):
        logging.getLogger(__name__).info("[trace] OTEL_SDK_DISABLED: no spans exported")
        return None
    provider = build_provider(service, cfg, extra_processor)
    if provider is None:
        return None
    trace.set_tracer_provider(provider)
    sampler = otlp_config.read_sampler(os.environ)
    if sampler.name:
        # gRPC and Redis spans asked for. Unasked, the libraries stay unpatched: a
        # patched Redis command costs ~30 us of CPU more even when nothing records it.
        instrument_libraries()
    tracing.set_process_sample_ratio(sampler.trajectory_ratio)
    # Trajectory spans (libra/tracing.py): straight to OTLP when it is configured (the
    # cheap path), else through the provider's processors (console, a test's).
    tracing.set_sink(build_span_sink(service, cfg) or OtelSpanSink(provider))
    return provider


def export_settings(cfg: TelemetryConfig) -> otlp_config.OtlpSettings | None:
    """Where spans go: ``cfg.otlp_endpoint`` or the ``OTEL_EXPORTER_OTLP_*`` variables
    (libra/otlp_config.py); None when no endpoint is set."""
    return otlp_config.read_settings(cfg.otlp_endpoint, os.environ, OTLP_EXPORT_TIMEOUT_S)


def build_span_sink(service: str, cfg: TelemetryConfig) -> OtlpSpanSink | None:
    """The trajectory span sink exporting over OTLP (``export_settings``) in batches from
    a thread of its own (shut down at exit, after a last export); None without an
    endpoint."""
    settings = export_settings(cfg)
    if settings is None:
        return None
    batch = otlp_config.read_batch(os.environ)  # refused, if bad, before a channel opens
    send, close = grpc_sender(settings)
    resource = Resource.create({"service.name": service}).attributes  # the SDK's, once
    sink = OtlpSpanSink(send, resource, _drops(service, settings.target),
                        max_queue_spans=batch.max_queue_spans, batch_size=batch.batch_size,
                        export_interval_s=batch.interval_s, timeout_s=settings.timeout_s)

    def stop() -> None:
        sink.shutdown()
        close()

    atexit.register(stop)
    return sink


def _drops(service: str, endpoint: str) -> DropCounter:
    key = (service, endpoint)
    if key not in _drop_counters:
        _drop_counters[key] = DropCounter(service, endpoint)
    return _drop_counters[key]


def build_provider(service: str, cfg: TelemetryConfig,
                   extra_processor: SpanProcessor | None = None) -> TracerProvider | None:
    """A tracer provider with the configured exporters (not installed); None when
    nothing exports. A failed OTLP export drops and counts its spans
    (``libra_trace_spans_dropped_total``) and warns once; it never blocks a service.
    Its sampler (the gRPC and Redis spans') is ``OTEL_TRACES_SAMPLER``'s, by default
    ``parentbased_always_off``: only inside a trace a caller sampled."""
    processors: list[SpanProcessor] = []
    settings = export_settings(cfg)
    if settings is not None:
        processors.append(_otlp_processor(service, settings))
    if cfg.trace_console:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    if extra_processor is not None:
        processors.append(extra_processor)
    if not processors:
        return None
    sampler = library_sampler(otlp_config.read_sampler(os.environ))
    provider = TracerProvider(resource=Resource.create({"service.name": service}),
                              sampler=sampler)
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def _otlp_processor(service: str, settings: otlp_config.OtlpSettings) -> SpanProcessor:
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    # The exporter logs every failed batch (and every retry), the batch processor
    # every span a full queue drops: DropCounter says it once and counts the rest.
    logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter").setLevel(
        logging.CRITICAL)
    drops = _drops(service, settings.target)
    queue_logger = logging.getLogger("opentelemetry.sdk._shared_internal")
    if QUEUE_FULL not in queue_logger.filters:
        queue_logger.addFilter(QUEUE_FULL)
    credentials = None
    if settings.tls:
        credentials = grpc.ssl_channel_credentials(
            settings.ca_pem or None, settings.client_key_pem or None,
            settings.client_cert_pem or None)
    exporter = OTLPSpanExporter(
        endpoint=settings.target, insecure=not settings.tls, credentials=credentials,
        headers=settings.headers, timeout=settings.timeout_s,
        compression=grpc.Compression.Gzip if settings.gzip else grpc.Compression.NoCompression)
    return CountingBatchProcessor(CountingExporter(exporter, drops), drops)


def library_sampler(settings: otlp_config.SamplerSettings) -> Sampler:
    """The SDK sampler ``settings`` name (``OTEL_TRACES_SAMPLER``; the default when
    unset is ``parentbased_always_off``)."""
    name = settings.library_sampler
    root = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(
        name.removeprefix("parentbased_")) or TraceIdRatioBased(settings.ratio)
    return ParentBased(root) if name.startswith("parentbased_") else root


def instrument_libraries(with_redis: bool = True) -> None:
    """Patch grpc.aio (client and server: carries the trace context) and, with
    ``with_redis``, redis (a span per command)."""
    global _instrumented
    if _instrumented:
        return
    from opentelemetry.instrumentation.grpc import (
        GrpcAioInstrumentorClient,
        GrpcAioInstrumentorServer,
        filters,
    )
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    # Health probes (compose, Kubernetes, the supervisor) were a third of a job's spans
    # and tell nothing about it.
    not_health = filters.negate(filters.health_check())
    GrpcAioInstrumentorServer(filter_=not_health).instrument()
    GrpcAioInstrumentorClient(filter_=not_health).instrument()
    if with_redis:
        RedisInstrumentor().instrument()
    _instrumented = True


def spans_recorded() -> bool:
    """Whether a tracer provider is installed (``init_tracing``'s, or a test's). Without
    one every span is a no-op, yet making it and making it current still costs a few
    microseconds of CPU: a hot path (the scheduler's report batches) skips it then."""
    return not isinstance(trace.get_tracer_provider(),
                          (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def tracer(name: str) -> trace.Tracer:
    """The OpenTelemetry tracer called ``name`` (spans are exported only where tracing was
    set up)."""
    return trace.get_tracer(name)
