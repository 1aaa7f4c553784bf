"""Scheduler service: admission under the staleness budget and placement of
trajectories on rollout buckets (C-MLFQ and baselines). Run: ``python -m services.scheduler``.

Every option can also come from LIBRA_SCHEDULER_<OPTION> (groups joined by __)
or from a TOML file given with --config."""

from __future__ import annotations

import asyncio
import logging

from libra.clock import SystemClock
from libra.config import load_config, redact
from libra.gc_policy import tune_for_latency
from libra.grpcx import Registration, serve
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.redis_connect import redis_client
from libra.telemetry import init_logging, init_tracing
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore

logger = logging.getLogger("services.scheduler")


async def main(cfg: SchedulerConfig) -> None:
    redis = redis_client(cfg.redis_url, decode_responses=False)
    # Leases and loads are re-read every 5th tick (loads are tracked in memory between).
    core = SchedulerCore(RedisSchedulerStore(redis), SystemClock(), tick_s=cfg.tick_s,
                         lease_snapshot_s=5 * cfg.tick_s,
                         observe_tick=scheduler_metrics.observe_tick)
    scheduler_metrics.register(core)
    tune_for_latency()  # full collections were the p99 ticks (libra/gc_policy.py)
    name = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
    registration = Registration(
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, SchedulerServicer(core), name
    )
    await serve("scheduler", cfg.server, [registration], run=core.run, drain=core.drain,
                health_probe=redis.ping, auth=cfg.auth)
    await redis.aclose()


if __name__ == "__main__":
    config = load_config(SchedulerConfig, "scheduler", description=__doc__)
    init_logging("scheduler", config.telemetry)
    init_tracing("scheduler", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    asyncio.run(main(config))
