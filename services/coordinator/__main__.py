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
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from libra.access import TokenStore
from libra.clients.rollout import GrpcRolloutClient
from libra.clients.runner import GrpcSchedulerClient, GrpcTrainerClient
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.clock import SystemClock
from libra.config import load_config, redact
from libra.data_roots import check_search_corpus, resolve_roots
from libra.gc_policy import tune_for_latency
from libra.grpc_auth import ClientAuth
from libra.grpcx import Registration, serve
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.redis_connect import redis_client
from libra.telemetry import init_logging, init_tracing
from scheduling.planner.live import live_planner
from services.coordinator import step_metrics
from services.coordinator.config import CoordinatorConfig
from services.coordinator.core import CoordinatorCore, CorpusCheck
from services.coordinator.dataset_check import check_dataset
from services.coordinator.elastic import ElasticWiring
from services.coordinator.episode_endpoint import EpisodeEndpoint
from services.coordinator.episode_store import RedisEpisodeStore
from services.coordinator.init_from_check import check_job_init_from
from services.coordinator.model_check import check_job_model
from services.coordinator.reconcile import ReconcileSettings, ReconcileWiring
from services.coordinator.rest import build_app
from services.coordinator.retention import run_retention
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore

logger = logging.getLogger("services.coordinator")

# A stalled Redis surfaces as a timeout after this long instead of hanging the call; the
# store then retries with backoff (client-level retries are off so that stays bounded).
REDIS_SOCKET_TIMEOUT_S = 2.0
# Deadline of reconciliation's status call: it runs under the lifecycle lock, which a
# create or a cancel may be waiting for.
STATUS_TIMEOUT_S = 3.0


def elastic_wiring(cfg: CoordinatorConfig) -> ElasticWiring:
    """Rollout clients (one per address, cached) and the planner for elastic jobs."""
    clients: dict[str, GrpcRolloutClient] = {}
    auth = ClientAuth.for_service(cfg.auth)

    def rollout_at(address: str) -> GrpcRolloutClient:
        if address not in clients:
            clients[address] = GrpcRolloutClient(address, cfg.peers.rpc_timeout_s, auth=auth)
        return clients[address]

    return ElasticWiring(planner_factory=live_planner, rollouts=rollout_at,
                         trainer_address=cfg.peers.trainer,
                         rpc_deadline_s=cfg.peers.rpc_timeout_s)


def corpus_check(cfg: CoordinatorConfig) -> CorpusCheck:
    """A job's ``tools.search_corpus`` files lie inside ``tool_data_roots`` (else
    InvalidArgument naming ``tools.search_corpus[i]``)."""
    roots = resolve_roots(cfg.tool_data_roots)
    return lambda spec: check_search_corpus(spec.tools.search_corpus, roots)


def build_core(cfg: CoordinatorConfig, redis: aioredis.Redis) -> CoordinatorCore:
    """The core with its production collaborators (peers' clients, the model check)."""
    peers = cfg.peers
    auth = ClientAuth.for_service(cfg.auth)
    return CoordinatorCore(
        store=RedisCoordinatorStore(redis, SystemClock()),
        trainer=GrpcTrainerClient(peers.trainer, peers.rpc_timeout_s, auth=auth),
        scheduler=GrpcSchedulerClient(peers.scheduler, peers.rpc_timeout_s, auth=auth),
        clock=SystemClock(), run_root=Path(cfg.run_root).resolve(),
        elastic=elastic_wiring(cfg), model_check=check_job_model, dataset_check=check_dataset,
        max_queued_jobs=cfg.max_queued_jobs,
        lease_renewals_per_s=cfg.lease_renewals_per_s,
        init_from_check=check_job_init_from,
        corpus_check=corpus_check(cfg),
        tool_catalog=GrpcToolGatewayClient(peers.toolgateway, peers.rpc_timeout_s, auth=auth),
        reconcile=ReconcileWiring(
            GrpcTrainerClient(peers.trainer, min(STATUS_TIMEOUT_S, peers.rpc_timeout_s),
                              auth=auth),
            ReconcileSettings(interval_s=cfg.reconcile_interval_s,
                              trainer_lost_s=cfg.trainer_lost_s)))


async def main(cfg: CoordinatorConfig) -> None:
    redis = redis_client(cfg.redis_url, decode_responses=True,
                              socket_timeout=REDIS_SOCKET_TIMEOUT_S,
                              socket_connect_timeout=REDIS_SOCKET_TIMEOUT_S,
                              retry=Retry(NoBackoff(), 0))
    core = build_core(cfg, redis)
    step_metrics.register(core)
    tune_for_latency()  # full collections of 80-160 ms delayed renewals (gc_policy.py)
    name = coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
    registration = Registration(coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                                CoordinatorServicer(core), name)
    http: uvicorn.Server | None = None
    if cfg.http_port >= 0:
        episodes = EpisodeEndpoint(RedisEpisodeStore(redis, SystemClock()), SystemClock())
        app = build_app(core, TokenStore(cfg.auth), episodes)  # follows token file rotation
        FastAPIInstrumentor.instrument_app(app)  # REST requests join the same traces
        # HTTPS with the gRPC server's certificate when one is configured.
        http = uvicorn.Server(uvicorn.Config(
            app, host=cfg.server.host, port=cfg.http_port, log_level="warning",
            ssl_certfile=cfg.auth.tls_cert_file or None,
            ssl_keyfile=cfg.auth.tls_key_file or None))
        # serve() owns the signals; uvicorn must not install its own handlers.
        http.install_signal_handlers = lambda: None  # type: ignore[method-assign]

    http_done = asyncio.Event()

    async def run_http() -> None:
        # Reconciliation and retention run beside the HTTP server for the process's life.
        reconciler = asyncio.create_task(core.run_reconciler())
        retention = asyncio.create_task(run_retention(
            core.list_jobs, Path(cfg.run_root).resolve(), cfg.retention))
        pruning = asyncio.create_task(step_metrics.run_series_pruning(core.list_jobs))
        try:
            if http is not None:
                await http.serve()
            else:
                await asyncio.Event().wait()
        finally:
            reconciler.cancel()
            retention.cancel()
            pruning.cancel()
            http_done.set()

    async def drain(_grace_s: float) -> None:
        if http is not None:
            # Let uvicorn end by itself (it checks should_exit every tick, also right after
            # its start-up): cancelled in the middle of starting, it left a lifespan task
            # behind that the interpreter's exit then waited on forever (1 in ~40 SIGTERMs
            # right after start-up under load). serve() bounds this wait by the grace.
            http.should_exit = True
            await http_done.wait()

    await serve("coordinator", cfg.server, [registration], run=run_http, drain=drain,
                health_probe=redis.ping, auth=cfg.auth)
    await redis.aclose()


if __name__ == "__main__":
    config = load_config(CoordinatorConfig, "coordinator", description=__doc__)
    init_logging("coordinator", config.telemetry)
    init_tracing("coordinator", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    asyncio.run(main(config))
