"""One telemetry setup for every service: logs, traces and Prometheus metrics.

Traces: spans are exported over OTLP when an endpoint is configured, or to the console
when asked. Only then is the SDK tracer provider installed and are gRPC and Redis
instrumented (context carried in gRPC metadata across services); otherwise the API's
no-op provider stays, so a span nobody reads costs no more than a function call (a
recording span with its events and attributes costs tens of microseconds, per batch of
decisions or per turn). Configure the exporter on every service together, or the trace
breaks at a service that does not export.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from libra.service_config import TelemetryConfig

_instrumented = False


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
    """Configure the root logger once per process (text key=value or JSON lines)."""
    handler = logging.StreamHandler(sys.stderr)
    if cfg.log_json:
        handler.setFormatter(_JsonFormatter(service))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s level=%(levelname)s service={service} logger=%(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level.upper())
    logging.Formatter.converter = time.gmtime


def init_tracing(service: str, cfg: TelemetryConfig,
                 extra_processor: SpanProcessor | None = None) -> TracerProvider | None:
    """Install the tracer provider and instrument gRPC (client and server) and Redis,
    when spans go somewhere; None (the no-op provider stays) when nothing exports."""
    processors: list[SpanProcessor] = []
    if cfg.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        processors.append(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=cfg.otlp_endpoint, insecure=True)))
    if cfg.trace_console:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    if extra_processor is not None:
        processors.append(extra_processor)
    if not processors:
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    instrument_libraries()
    return provider


def instrument_libraries(with_redis: bool = True) -> None:
    """Patch grpc.aio (client and server: carries the trace context) and, with
    ``with_redis``, redis (a span per command)."""
    global _instrumented
    if _instrumented:
        return
    from opentelemetry.instrumentation.grpc import (
        GrpcAioInstrumentorClient,
        GrpcAioInstrumentorServer,
    )
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    GrpcAioInstrumentorServer().instrument()
    GrpcAioInstrumentorClient().instrument()
    if with_redis:
        RedisInstrumentor().instrument()
    _instrumented = True


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)
