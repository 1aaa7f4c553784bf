"""Benchmark-only process for bench_scheduler_overhead.py: every rollout instance of the
stack in one process, with placement either by the scheduler service (``--mode
service``: the real gRPC client) or in this process (``--mode inproc``: the scheduler
core runs here, its loop on this event loop, and the rollout cores call it directly).

In ``inproc`` mode this process also serves the scheduler's gRPC API on the port the
coordinator was given, so job start and stop reach the in-process core exactly as they
reach the service. Everything else (coordinator, trainer, tool gateway, Redis) is the
normal stack in both modes.

Run by the benchmark: ``python benchmarks/bench_scheduler_host.py --mode inproc ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections import Counter
from typing import Any

import redis.asyncio as aioredis

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clients.scheduler import IMPLIED_STAY, GrpcSchedulerClient
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.clock import SystemClock
from libra.errors import LibraError
from libra.grpcx import Registration, Server
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.service_config import ServerConfig
from services.rollout.backend import TorchEngineLoader
from services.rollout.config import RolloutConfig
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.store import RedisRolloutStore
from services.scheduler.core import SchedulerCore, ToolReturnReport
from services.scheduler.metrics import record_decisions
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore

logger = logging.getLogger("bench.host")


class InprocScheduler:
    """``SchedulerApi`` of the rollout core, answered by a scheduler core in this process
    (the same core, policy and Redis store as the service; no RPC, no batching)."""

    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision:
        (result,) = await self._core.report_tool_returns(
            instance_id, lease_epoch, [ToolReturnReport(job_id, trajectory_id, state,
                                                        tokens_so_far)])
        if isinstance(result, LibraError):
            raise result
        record_decisions([(trajectory_id, result)])
        return result


class StayScheduler:
    """``--no-decisions``: every tool return stays, answered on the spot (no report)."""

    async def report_tool_return(self, *_args: Any, **_kwargs: Any) -> t.PlacementDecision:
        return t.PlacementDecision(t.DecisionAction.STAY, reason="decisions_off")


class TimedScheduler:
    """Wraps either arm's ``SchedulerApi`` and records each answered decision's latency
    (the report's round trip; the rollout waits on it only while a move is pending). A
    stay settled by a later answer has no latency of its own: it is only counted."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.num_reports = 0
        self.latencies_ms: list[float] = []
        self.reasons: Counter[str] = Counter()  # "action/reason" -> decisions

    async def report_tool_return(self, *args: Any, **kwargs: Any) -> t.PlacementDecision:
        started = time.perf_counter()
        self.num_reports += 1
        decision = await self._inner.report_tool_return(*args, **kwargs)
        if decision.reason != IMPLIED_STAY:
            self.latencies_ms.append(1000 * (time.perf_counter() - started))
        self.reasons[f"{decision.action.value}/{decision.reason}"] += 1
        return decision

    def summary(self) -> str:
        lat = sorted(self.latencies_ms) or [0.0]
        pick = [lat[min(len(lat) - 1, int(q * len(lat)))] for q in (0.5, 0.9, 0.99)]
        return (f"DECISIONS {self.num_reports} answered {len(self.latencies_ms)} "
                f"latency_ms p50 {pick[0]:.2f} "
                f"p90 {pick[1]:.2f} p99 {pick[2]:.2f} mean {sum(lat) / len(lat):.2f} "
                f"by_reason {dict(sorted(self.reasons.items()))}")


async def serve_inproc_scheduler(redis: Any, port: int) -> tuple[SchedulerCore, Server]:
    core = SchedulerCore(RedisSchedulerStore(redis), SystemClock(), tick_s=0.05,
                         lease_snapshot_s=0.25)  # as services/scheduler/__main__.py
    name = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
    server = Server("scheduler", ServerConfig(port=port, metrics_port=-1),
                    [Registration(scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server,
                                  SchedulerServicer(core), name)])
    await server.start()
    return core, server


async def main(args: argparse.Namespace) -> None:
    redis = aioredis.from_url(args.redis_url, decode_responses=False)
    tasks: list[asyncio.Task] = []
    server = None
    if args.mode == "inproc":
        core, server = await serve_inproc_scheduler(redis, args.scheduler_port)
        tasks.append(asyncio.create_task(core.run()))
        scheduler: Any = InprocScheduler(core)
    else:
        scheduler = GrpcSchedulerClient(f"127.0.0.1:{args.scheduler_port}",
                                        linger_s=args.report_linger_ms / 1000,
                                        max_unanswered=args.report_max_unanswered)
    timed = TimedScheduler(StayScheduler() if args.no_decisions else scheduler)
    rollouts = []
    for spec in args.rollout:
        instance_id, bucket, max_batch, max_trajs = spec.split(":")
        settings = RolloutSettings(instance_id=instance_id, bucket=bucket,
                                   max_batch_size=int(max_batch),
                                   max_trajectories=int(max_trajs))
        rollout = RolloutCore(settings, RedisRolloutStore(redis), TorchEngineLoader(1, 0),
                              GrpcToolGatewayClient(args.toolgateway),
                              timed, GrpcCoordinatorClient(args.coordinator),
                              SystemClock())
        await rollout.register()
        rollouts.append(rollout)
        tasks.append(asyncio.create_task(rollout.run()))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("READY", flush=True)
    await stop.wait()
    print(timed.summary(), flush=True)
    waits = sum(r.num_decision_waits for r in rollouts)
    wait_s = sum(r.decision_wait_s for r in rollouts)
    print(f"MOVES handed_off {sum(r.num_moves_handed_off for r in rollouts)} "
          f"mid_turn {sum(r.num_moves_mid_turn for r in rollouts)} "
          f"moot {sum(r.num_moves_moot for r in rollouts)} "
          f"decision_waits {waits} wait_ms_total {1000 * wait_s:.1f} "
          f"wait_ms_per_tool_return {1000 * wait_s / max(timed.num_reports, 1):.3f}",
          flush=True)
    if isinstance(scheduler, GrpcSchedulerClient):
        print(f"REPORTS {scheduler.num_reports} BATCHES {scheduler.num_report_batches} "
              f"ANSWERS {scheduler.num_report_answers} "
              f"STREAMS {scheduler.num_report_streams}", flush=True)
    for rollout in rollouts:
        try:
            await rollout.drain(0.5)
        except LibraError as exc:  # the coordinator may be gone already
            logger.warning("drain: %s", exc)
    for task in tasks:
        task.cancel()
    if server is not None:
        await server.stop()
    await redis.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["service", "inproc"], required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--toolgateway", required=True)
    parser.add_argument("--scheduler-port", type=int, required=True)
    parser.add_argument("--report-linger-ms", type=int,
                        default=RolloutConfig().report_linger_ms,
                        help="service mode: the rollout's report batching (its default)")
    parser.add_argument("--report-max-unanswered", type=int,
                        default=RolloutConfig().report_max_unanswered,
                        help="service mode: all-stay batches the scheduler may leave "
                             "unanswered (its default; 0 answers every batch)")
    parser.add_argument("--no-decisions", action="store_true",
                        help="answer every tool return 'stay' here, reporting nothing")
    parser.add_argument("--rollout", action="append", required=True,
                        help="INSTANCE:BUCKET:MAX_BATCH:MAX_TRAJECTORIES (repeatable)")
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main(parser.parse_args()))
