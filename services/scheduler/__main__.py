"""Scheduler service: admission under the staleness budget and placement of
trajectories on rollout buckets (C-MLFQ and baselines). Run: ``python -m services.scheduler``.

Every option can also come from LIBRA_SCHEDULER_<OPTION> (groups joined by __)
or from a TOML file given with --config."""

from __future__ import annotations

import asyncio
import logging
import sys

from libra.clock import SystemClock
from libra.config import load_config, redact
from libra.gc_policy import tune_for_latency
from libra.grpcx import Registration, serve
from libra.loop_thread import LoopThread
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.redis_connect import redis_client
from libra.telemetry import init_logging, init_tracing
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.config import SchedulerConfig
from services.scheduler.core import SchedulerCore
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore

logger = logging.getLogger("services.scheduler")

# How long a thread may hold the interpreter while another waits for it (CPython's
# default is 5 ms). The report loop holds it most of the time at 1,000 instances, and
# the tick thread waits for it at each of its steps (a Redis reply in, the next step):
# 1 ms bounds that wait per step where 5 ms could add tens of ms to a tick.
SWITCH_INTERVAL_S = 0.001


async def main(cfg: SchedulerConfig) -> None:
    redis = redis_client(cfg.redis_url, decode_responses=False)
    # The tick runs on a loop of its own, with a Redis client of its own (used on that
    # loop only): on the gRPC loop each of its replies waited for the report batches
    # queued before it (libra/loop_thread.py).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    tick_thread = LoopThread("scheduler-tick")
    tick_redis = redis_client(cfg.redis_url, decode_responses=False)
    # Leases and loads are re-read every 5th tick (loads are tracked in memory between).
    core = SchedulerCore(RedisSchedulerStore(tick_redis), SystemClock(), tick_s=cfg.tick_s,
                         lease_snapshot_s=5 * cfg.tick_s,
                         observe_tick=scheduler_metrics.observe_tick,
                         report_store=RedisSchedulerStore(redis), tick_thread=tick_thread)
    scheduler_metrics.register(core)
    tune_for_latency()  # full collections were the p99 ticks (libra/gc_policy.py)
    name = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
    registration = Registration(
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server, SchedulerServicer(core), name
    )
    await serve("scheduler", cfg.server, [registration], run=core.run, drain=core.drain,
                health_probe=redis.ping, auth=cfg.auth)
    await tick_thread.run(tick_redis.aclose())
    tick_thread.stop()
    await redis.aclose()


if __name__ == "__main__":
    config = load_config(SchedulerConfig, "scheduler", description=__doc__)
    init_logging("scheduler", config.telemetry)
    init_tracing("scheduler", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    asyncio.run(main(config))
