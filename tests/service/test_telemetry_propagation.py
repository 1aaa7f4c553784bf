"""Trace context crosses services, every server exposes Prometheus metrics, and each
batch on the scheduler's tool-return stream is a span of its own.

Real: the SDK tracer provider installed by ``libra.telemetry.init_tracing`` with the
gRPC aio client/server instrumentation, two ``libra.grpcx.Server`` instances on port 0
(front -> coordinator), the typed clients and the /metrics HTTP endpoint.
Fakes: the coordinator's trainer/scheduler runners; spans go to an in-memory exporter.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

import libra.telemetry as telemetry
from libra import redis_keys as keys
from libra import tracing
from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clients.scheduler import GrpcSchedulerClient
from libra.clock import FakeClock
from libra.grpcx import Registration, Server
from libra.jobspec import JobSpec
from libra.proto.coordinator.v1 import coordinator_pb2 as pb
from libra.proto.coordinator.v1 import coordinator_pb2_grpc as pb_grpc
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.service_config import ServerConfig, TelemetryConfig
from libra.wire.coordinator import job_to_proto
from libra_cli.redis_server import EmbeddedRedis
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import InMemoryCoordinatorStore
from services.scheduler import metrics
from services.scheduler.core import SchedulerCore
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore
from tests.fakes.runner import FakeRunner
from tests.service.grpc_harness import serving

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CoordinatorService"].full_name




class FrontServicer(pb_grpc.CoordinatorServiceServicer):
    """A second service whose ListJobs asks the coordinator (one hop downstream)."""

    def __init__(self, downstream: GrpcCoordinatorClient) -> None:
        self._downstream = downstream

    async def ListJobs(self, request, context):  # noqa: N802, ANN001
        jobs = await self._downstream.list_jobs()
        return pb.ListJobsResponse(jobs=[job_to_proto(j) for j in jobs])


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    # The global tracer provider can be set once per process: reuse one if a previous
    # module installed it, and undo the library patches afterwards.
    # These calls start their own traces: by default (parentbased_always_off) gRPC spans
    # are recorded only under a sampled caller; the SDK's own default records them all.
    memory = InMemorySpanExporter()
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        current.add_span_processor(SimpleSpanProcessor(memory))
        telemetry.instrument_libraries()
    else:
        before = os.environ.get("OTEL_TRACES_SAMPLER")
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_always_on"
        try:
            telemetry.init_tracing("test", TelemetryConfig(),
                                   extra_processor=SimpleSpanProcessor(memory))
        finally:
            if before is None:
                del os.environ["OTEL_TRACES_SAMPLER"]
            else:
                os.environ["OTEL_TRACES_SAMPLER"] = before
        tracing.set_process_sample_ratio(None)
    yield memory
    from opentelemetry.instrumentation.grpc import (
        GrpcAioInstrumentorClient,
        GrpcAioInstrumentorServer,
    )
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    GrpcAioInstrumentorServer().uninstrument()
    GrpcAioInstrumentorClient().uninstrument()
    RedisInstrumentor().uninstrument()
    telemetry._instrumented = False
    memory.shutdown()


@pytest.fixture
async def chain(exporter: InMemorySpanExporter,
                tmp_path: Path) -> AsyncIterator[tuple[Server, Server]]:
    clock = FakeClock()
    core = CoordinatorCore(InMemoryCoordinatorStore(clock), FakeRunner(), FakeRunner(), clock,
                           tmp_path)
    back = Server("coordinator", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=1.0),
                  [Registration(pb_grpc.add_CoordinatorServiceServicer_to_server,
                                CoordinatorServicer(core), SERVICE_NAME)])
    await back.start()
    downstream = GrpcCoordinatorClient(f"127.0.0.1:{back.port}", timeout_s=5.0)
    front = Server("front", ServerConfig(port=0, metrics_port=0, shutdown_grace_s=1.0),
                   [Registration(pb_grpc.add_CoordinatorServiceServicer_to_server,
                                 FrontServicer(downstream), SERVICE_NAME)])
    await front.start()
    exporter.clear()
    yield front, back
    await front.stop()
    await downstream.close()
    await back.stop()


async def call_front(front: Server) -> None:
    client = GrpcCoordinatorClient(f"127.0.0.1:{front.port}", timeout_s=5.0)
    try:
        assert await client.list_jobs() == []
    finally:
        await client.close()


async def finished_spans(exporter: InMemorySpanExporter, want: int) -> list[ReadableSpan]:
    # Server spans end after the response is sent, possibly after the client returned.
    for _ in range(100):
        spans = list(exporter.get_finished_spans())
        if len([s for s in spans if s.name.endswith("/ListJobs")]) >= want:
            return spans
        await asyncio.sleep(0.02)
    return list(exporter.get_finished_spans())


async def test_server_spans_of_both_hops_share_the_callers_trace(
        chain: tuple[Server, Server], exporter: InMemorySpanExporter) -> None:
    front, _back = chain
    await call_front(front)
    spans = [s for s in await finished_spans(exporter, 4) if s.name.endswith("/ListJobs")]
    clients = [s for s in spans if s.kind is SpanKind.CLIENT]
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert (len(clients), len(servers)) == (2, 2)
    assert len({s.context.trace_id for s in spans}) == 1


async def test_downstream_server_span_descends_from_upstream_server_span(
        chain: tuple[Server, Server], exporter: InMemorySpanExporter) -> None:
    front, back = chain
    await call_front(front)
    spans = [s for s in await finished_spans(exporter, 4) if s.name.endswith("/ListJobs")]
    by_id = {s.context.span_id: s for s in spans}
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    # The back server's span is the one whose ancestors include another server span.

    def ancestors(span: ReadableSpan) -> list[ReadableSpan]:
        out = []
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            out.append(span)
        return out

    chains = {s.context.span_id: ancestors(s) for s in servers}
    downstream = [s for s in servers
                  if any(a.kind is SpanKind.SERVER for a in chains[s.context.span_id])]
    assert len(downstream) == 1
    upstream = next(a for a in chains[downstream[0].context.span_id]
                    if a.kind is SpanKind.SERVER)
    assert upstream is not downstream[0]
    # The upstream server span's own parent is the test's client span (root of the trace).
    root = ancestors(upstream)
    assert [s.kind for s in root] == [SpanKind.CLIENT]
    assert root[0].parent is None
    assert back.port != front.port


async def test_metrics_endpoint_counts_served_rpcs(chain: tuple[Server, Server]) -> None:
    front, _back = chain
    await call_front(front)
    url = f"http://127.0.0.1:{front.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    samples = [sample for family in text_string_to_metric_families(body.decode())
               for sample in family.samples if sample.name == "libra_rpc_server_total"]
    assert any(sample.labels == {"service": "front", "method": "ListJobs", "code": "OK"}
               and sample.value >= 1 for sample in samples)


async def test_stopped_server_releases_its_metrics_port() -> None:
    server = Server("scratch", ServerConfig(port=0, metrics_port=0, shutdown_grace_s=1.0), [])
    await server.start()
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    await server.stop()
    with pytest.raises(OSError):
        await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=2).read())


async def test_each_tool_return_batch_is_a_span_with_its_decisions(
        exporter: InMemorySpanExporter, redis_server: EmbeddedRedis) -> None:
    r = aioredis.from_url(redis_server.url)
    await r.hset(keys.job("traced"), mapping={"spec_json": JobSpec().to_json(),
                                              "state": "running"})
    await r.sadd(keys.WORKERS, "rollout-t")
    await r.hset(keys.lease("rollout-t"), mapping={"role": "core-rollout", "bucket": "short",
                                                   "epoch": 1})
    core = SchedulerCore(RedisSchedulerStore(r), FakeClock())
    state = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
    async with serving("scheduler", scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                       SchedulerServicer(core), scheduler_pb2.DESCRIPTOR,
                       "SchedulerService") as address:
        client = GrpcSchedulerClient(address)
        await client.start_job("traced")
        exporter.clear()
        for index in range(2):  # two batches on one stream
            await client.report_tool_return("traced", f"traj-{index}", state, 3, "rollout-t", 1)
        await client.close()
    await r.aclose()
    batches = [s for s in exporter.get_finished_spans()
               if s.name == "scheduler.ToolReturns.batch"]
    assert len(batches) == 2
    for span, index in zip(batches, range(2), strict=True):
        (event,) = span.events
        assert event.attributes is not None
        assert event.attributes[metrics.ATTR_TRAJECTORY] == f"traj-{index}"
        assert event.attributes[metrics.ATTR_REASON] == "unknown_trajectory"


async def test_health_probes_make_no_spans(chain: tuple[Server, Server],
                                           exporter: InMemorySpanExporter) -> None:
    """Probes (compose, Kubernetes, the supervisor) come every few seconds from every
    service; their spans outnumbered a job's own and told nothing about it."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    front, _back = chain
    async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    await call_front(front)  # spans of a real call still come (and end after the probe's)
    names = {s.name for s in await finished_spans(exporter, 4)}
    assert any(name.endswith("/ListJobs") for name in names)
    assert not [name for name in names if "grpc.health" in name], names
