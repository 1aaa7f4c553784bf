"""Scrape ``/metrics`` of real services after a real action and find the series.

Real: ``libra.grpcx.Server`` with its metrics endpoint on a free port, the coordinator
core on the session's redis-server (FakeRunner stands in for the trainer and scheduler
it would start), the tool gateway's real core and tools, the typed gRPC clients, HTTP
over a socket and prometheus-client's text parser.
"""

from __future__ import annotations

import asyncio
import shutil
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.clock import SystemClock
from libra.grpcx import Registration, Server, watch_dependency
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc
from libra.service_config import ServerConfig
from services.coordinator import step_metrics
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from services.toolgateway.__main__ import build_core
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.servicer import ToolGatewayServicer
from tests.fakes.runner import FakeRunner
from tests.waiting import wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of the endpoint, keyed by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


CORES: dict[int, CoordinatorCore] = {}  # metrics port -> the core the server serves


@pytest.fixture
async def coordinator(redis: Any, tmp_path: Path) -> AsyncIterator[tuple[Server, Any]]:
    await redis.flushdb()  # the job queue is global: start from an empty one
    core = CoordinatorCore(RedisCoordinatorStore(redis, SystemClock()), FakeRunner(),
                           FakeRunner(), SystemClock(), tmp_path / "runs")
    step_metrics.register(core)
    name = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
    srv = Server("coordinator", ServerConfig(port=0, metrics_port=0, shutdown_grace_s=2.0),
                 [Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                               CoordinatorServicer(core), name)])
    await srv.start()
    CORES[srv.metrics_port] = core
    client = GrpcCoordinatorClient(f"127.0.0.1:{srv.port}", timeout_s=10.0)
    yield srv, client
    del CORES[srv.metrics_port]
    await client.close()
    await srv.stop()


STEP = {"step": 1, "policy_version": 1, "reward_mean": 0.625, "num_trajectories": 8,
        "tokens_mean": 50.0, "rollout_s": 1.5, "train_s": 0.75, "publish_s": 0.25,
        "wall_s": 2.5, "dropped_stale": 2, "dropped_failed": 1, "migrations": 3,
        "bucket_occupancy": {"short": 5, "long": 3}, "hybrid_workers": 1,
        "hybrid_joining": 0, "recompute_s": 0.125}


async def test_coordinator_exports_a_stored_step(coordinator: tuple[Server, Any]) -> None:
    srv, client = coordinator
    job = await client.create_job('name = "metrics"\n[algorithm]\nnum_steps = 4\n')
    await client.report_step(job.job_id, STEP, idempotency_key="k1")
    got = scrape(srv.metrics_port)
    job_id = job.job_id
    assert value(got, "libra_job_reward_mean", job=job_id) == 0.625
    assert value(got, "libra_job_step", job=job_id) == 1
    assert value(got, "libra_job_policy_version", job=job_id) == 1
    assert value(got, "libra_job_steps_total", job=job_id) == 1
    for phase, seconds in (("rollout_wait", 1.5), ("train", 0.75), ("publish", 0.25),
                           ("recompute", 0.125)):
        assert value(got, "libra_job_step_phase_seconds_sum", job=job_id,
                     phase=phase) == seconds
    # Not reported by this step: no series rather than a made-up zero.
    assert value(got, "libra_job_step_phase_seconds_count", job=job_id, phase="reload") is None
    assert value(got, "libra_job_trajectories_trained_total", job=job_id) == 8
    assert value(got, "libra_job_tokens_trained_total", job=job_id) == 400
    assert value(got, "libra_job_dropped_total", job=job_id, reason="stale") == 2
    assert value(got, "libra_job_dropped_total", job=job_id, reason="failed") == 1
    assert value(got, "libra_job_migrations_total", job=job_id) == 3
    assert value(got, "libra_job_bucket_placements_total", job=job_id, bucket="short") == 5
    assert value(got, "libra_job_hybrid_workers", job=job_id, state="training") == 1
    assert value(got, "libra_rpc_server_total", service="coordinator",
                 method="ReportStep", code="OK") is not None


async def test_repeated_step_report_is_not_counted_twice(
        coordinator: tuple[Server, Any]) -> None:
    srv, client = coordinator
    job = await client.create_job('name = "metrics"\n[algorithm]\nnum_steps = 4\n')
    await client.report_step(job.job_id, STEP, idempotency_key="k1")
    await client.report_step(job.job_id, STEP, idempotency_key="k1")  # a retry
    got = scrape(srv.metrics_port)
    assert value(got, "libra_job_steps_total", job=job.job_id) == 1
    assert value(got, "libra_job_trajectories_trained_total", job=job.job_id) == 8


async def test_queued_jobs_follow_submit_and_cancel(coordinator: tuple[Server, Any]) -> None:
    srv, client = coordinator
    spec = 'name = "metrics"\n[algorithm]\nnum_steps = 4\n'
    running = await client.create_job(spec)  # nothing active: it starts at once
    assert value(scrape(srv.metrics_port), "libra_coordinator_queued_jobs") == 0
    waiting = await client.create_job(spec)  # queued behind the running one
    assert (running.state.value, waiting.state.value) == ("running", "pending")
    assert value(scrape(srv.metrics_port), "libra_coordinator_queued_jobs") == 1
    await client.cancel_job(waiting.job_id)
    assert value(scrape(srv.metrics_port), "libra_coordinator_queued_jobs") == 0


async def test_no_series_carries_a_trajectory_id(coordinator: tuple[Server, Any]) -> None:
    srv, client = coordinator
    job = await client.create_job('name = "metrics"\n[algorithm]\nnum_steps = 4\n')
    await client.report_step(job.job_id, STEP)
    for _name, labels in scrape(srv.metrics_port):
        assert not {key for key, _ in labels} & {"trajectory", "trajectory_id", "group",
                                                  "call_id"}


async def test_a_deleted_jobs_series_are_removed_and_a_running_jobs_kept(
        coordinator: tuple[Server, Any]) -> None:
    """`libra gc` deleted the ended job's run folder: the pruning pass drops every
    libra_job_* series of it (steps, phases, planner), the running job keeps its own."""
    srv, client = coordinator
    spec = 'name = "metrics"\n[algorithm]\nnum_steps = 4\n'
    ended = await client.create_job(spec)
    await client.report_step(ended.job_id, STEP, idempotency_key="k1")
    step_metrics.export_plan(ended.job_id, {"fired": True, "applied": True,
                                            "net_gain_s": 1.5})
    await client.cancel_job(ended.job_id)
    running = await client.create_job(spec)
    await client.report_step(running.job_id, STEP, idempotency_key="k2")
    core = CORES[srv.metrics_port]
    Path(ended.run_dir).mkdir(parents=True)
    # Jobs of earlier tests (a flushed store) go now; these two stay.
    gone = await step_metrics.prune_ended_jobs(core.list_jobs)
    assert not {ended.job_id, running.job_id} & set(gone)
    shutil.rmtree(ended.run_dir)  # what `libra gc` does to an ended job's folder
    assert not Path(running.run_dir).exists()  # running, no folder yet: kept all the same
    assert await step_metrics.prune_ended_jobs(core.list_jobs) == [ended.job_id]
    got = scrape(srv.metrics_port)
    assert not [name for name, labels in got if ("job", ended.job_id) in labels]
    assert value(got, "libra_job_steps_total", job=running.job_id) == 1
    assert value(got, "libra_job_step_phase_seconds_count", job=running.job_id,
                 phase="train") == 1


async def test_toolgateway_exports_tool_latency_and_status() -> None:
    core = build_core(ToolGatewayConfig(calculator_transient_failure_rate=0.0))
    name = toolgateway_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name
    srv = Server("toolgateway", ServerConfig(port=0, metrics_port=0, shutdown_grace_s=2.0),
                 [Registration(toolgateway_pb2_grpc.add_ToolGatewayServiceServicer_to_server,
                               ToolGatewayServicer(core), name)])
    await srv.start()
    client = GrpcToolGatewayClient(f"127.0.0.1:{srv.port}", timeout_s=10.0)
    try:
        before = scrape(srv.metrics_port)
        ok = await client.execute("traj-1", "c1", "calculator", {"expression": "2+3"},
                                  5000)
        bad = await client.execute("traj-1", "c2", "calculator", {"expression": "2+"},
                                   5000)
        got = scrape(srv.metrics_port)
    finally:
        await client.close()
        await srv.stop()

    def grew(name: str, **labels: str) -> float:
        return (value(got, name, **labels) or 0.0) - (value(before, name, **labels) or 0.0)

    assert grew("libra_tool_calls_total", tool="calculator", status=ok.status.value) >= 1
    assert grew("libra_tool_calls_total", tool="calculator", status=bad.status.value) >= 1
    assert ok.status.value != bad.status.value
    assert grew("libra_tool_call_seconds_count", tool="calculator") == 2


async def test_redis_round_trip_is_timed_on_the_health_loop(redis: Any) -> None:
    """The health loop's PING to a real Redis is observed; a failing probe is not."""
    srv = Server("scheduler", ServerConfig(port=0, metrics_port=0, shutdown_grace_s=2.0), [])
    await srv.start()

    def pings() -> float:
        return value(scrape(srv.metrics_port), "libra_redis_roundtrip_seconds_count",
                     service="scheduler") or 0.0

    failures = []

    async def failing() -> None:
        failures.append(1)
        raise ConnectionError("redis down")

    try:
        before = pings()
        watcher = asyncio.create_task(watch_dependency(srv, redis.ping, interval_s=0.05))
        await wait_until(lambda: pings() >= before + 2)
        watcher.cancel()
        counted = pings()
        watcher = asyncio.create_task(watch_dependency(srv, failing, interval_s=0.05))
        await wait_until(lambda: len(failures) >= 2)  # one whole failed pass at least
        watcher.cancel()
        assert pings() == counted
    finally:
        await srv.stop()
