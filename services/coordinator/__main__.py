"""Coordinator service: the public job API (gRPC and REST with OpenAPI at /docs) and
the worker registry with fenced leases. Run: ``python -m services.coordinator``.

Every option can also come from LIBRA_COORDINATOR_<OPTION> (groups joined by __)
or from a TOML file given with --config."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import redis.asyncio as aioredis
import uvicorn
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

from libra.clients.runner import GrpcSchedulerClient, GrpcTrainerClient
from libra.clock import SystemClock
from libra.config import load_config, redact
from libra.grpcx import Registration, serve
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.telemetry import init_logging, init_tracing
from services.coordinator.config import CoordinatorConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.rest import build_app
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore

logger = logging.getLogger("services.coordinator")


async def main(cfg: CoordinatorConfig) -> None:
    redis = aioredis.from_url(cfg.redis_url, decode_responses=True)
    peers = cfg.peers
    core = CoordinatorCore(
        store=RedisCoordinatorStore(redis, SystemClock()),
        trainer=GrpcTrainerClient(peers.trainer, peers.rpc_timeout_s),
        scheduler=GrpcSchedulerClient(peers.scheduler, peers.rpc_timeout_s),
        clock=SystemClock(), run_root=Path(cfg.run_root).resolve())
    name = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
    registration = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                                CoordinatorServicer(core), name)
    http: uvicorn.Server | None = None
    if cfg.http_port >= 0:
        app = build_app(core)
        FastAPIInstrumentor.instrument_app(app)  # REST requests join the same traces
        http = uvicorn.Server(uvicorn.Config(app, host=cfg.server.host,
                                             port=cfg.http_port, log_level="warning"))
        # serve() owns the signals; uvicorn must not install its own handlers.
        http.install_signal_handlers = lambda: None  # type: ignore[method-assign]

    async def run_http() -> None:
        if http is not None:
            await http.serve()
        else:
            await asyncio.Event().wait()

    async def drain(_grace_s: float) -> None:
        if http is not None:
            http.should_exit = True

    await serve("coordinator", cfg.server, [registration], run=run_http, drain=drain)
    await redis.aclose()


if __name__ == "__main__":
    config = load_config(CoordinatorConfig, "coordinator", description=__doc__)
    init_logging("coordinator", config.telemetry)
    init_tracing("coordinator", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    asyncio.run(main(config))
