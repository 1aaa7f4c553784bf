"""A trajectory's trace across real service processes: `libra up` starts Redis and the
five services with ``LIBRA_TELEMETRY__OTLP_ENDPOINT`` aimed at an OTLP/gRPC receiver in
this test process (the collector's TraceService from opentelemetry-proto); a one-step
job runs, and every trained trajectory's spans, recorded by the scheduler, a rollout
instance and the trainer (three processes, each its own exporter), form one tree under
the root the scheduler chose at admission: the trace context crossed the processes in
the trajectory record, through Redis.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import small_job, stack_up, wait_for_job
from tests.otlp_memory import serving_collector

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Received:
    service: str
    name: str
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    outcome: str  # the root's libra.outcome ("" on other spans)


class Receiver(pb_grpc.TraceServiceServicer):
    """Keeps the spans every service exports (their service name from the resource)."""

    def __init__(self) -> None:
        self.spans: list[Received] = []

    def Export(self, request, context):  # noqa: N802, ANN001
        for resource in request.resource_spans:
            service = next((a.value.string_value for a in resource.resource.attributes
                            if a.key == "service.name"), "")
            self.spans += [Received(service, span.name, span.trace_id, span.span_id,
                                    span.parent_span_id, next(
                                        (a.value.string_value for a in span.attributes
                                         if a.key == "libra.outcome"), ""))
                           for scope in resource.scope_spans for span in scope.spans]
        return pb.ExportTraceServiceResponse()


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    servicer = Receiver()
    with serving_collector(servicer, workers=4) as address:
        yield servicer, address


@pytest.fixture(scope="module")
def traced_stack(receiver: tuple[Receiver, str],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    # The services inherit the environment `libra up` runs in.
    before = os.environ.get("LIBRA_TELEMETRY__OTLP_ENDPOINT")
    os.environ["LIBRA_TELEMETRY__OTLP_ENDPOINT"] = receiver[1]
    try:
        yield from stack_up(Path(tmp_path_factory.mktemp("runs")), restart_limit=0)
    finally:
        if before is None:
            os.environ.pop("LIBRA_TELEMETRY__OTLP_ENDPOINT", None)
        else:
            os.environ["LIBRA_TELEMETRY__OTLP_ENDPOINT"] = before


STORY = ("scheduler.place", "rollout.generate", "rollout.publish", "trainer.train")


def _every_story_arrived(spans: list[Received], trained: int) -> bool:
    roots = [s for s in spans if s.name == "trajectory" and s.outcome == "trained"]
    named = {(s.trace_id, s.name) for s in spans}
    return len(roots) >= trained and all(
        (root.trace_id, name) in named for root in roots for name in STORY)


async def test_trained_trajectory_spans_from_three_processes_share_one_root(
        traced_stack: dict, receiver: tuple[Receiver, str]) -> None:
    client = stack.coordinator_client(traced_stack)
    job = await client.create_job(small_job(num_steps=1), "json")
    job, _steps, counters = await wait_for_job(client, job.job_id)
    await client.close()
    assert job.state is t.JobState.SUCCEEDED, job.message
    spans = receiver[0].spans
    # Each service exports in batches (every 5 s, each on its own clock): wait for the
    # trainer's roots and for every service's children of them.
    deadline = time.monotonic() + 60
    while not _every_story_arrived(spans, counters["trained"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    roots = [s for s in spans if s.name == "trajectory" and s.outcome == "trained"]
    assert len(roots) == counters["trained"] >= 1
    for root in roots:
        assert root.parent_span_id == b""
        children = [s for s in spans if s.trace_id == root.trace_id and s is not root]
        assert all(s.parent_span_id == root.span_id for s in children)
        by_name = {s.name: s.service for s in children}
        assert by_name["scheduler.place"] == "scheduler"
        assert by_name["rollout.generate"].startswith("rollout-")
        assert by_name["rollout.publish"].startswith("rollout-")
        assert by_name["trainer.train"] == root.service
        assert root.service.startswith("trainer")
    assert any(s.name == "trainer.step" for s in spans)
