"""Rollout service: one inference instance in one bucket running the agent loop of the
trajectories placed on it (torch or vLLM engine). Run: ``python -m services.rollout``.

Every option can also come from LIBRA_ROLLOUT_<OPTION> (groups joined by __)
or from a TOML file given with --config."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tempfile
from pathlib import Path

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from libra import types as t
from libra.allocator import keep_freed_buffers
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clients.gradient import GrpcGradientChannel
from libra.clients.runner import GrpcSchedulerClient
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.clients.weights import GrpcWeightClient
from libra.clock import SystemClock
from libra.config import load_config, redact
from libra.grpc_auth import ClientAuth
from libra.grpcx import Registration, Server, serve
from libra.proto.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from libra.redis_connect import redis_client
from libra.telemetry import init_logging, init_tracing
from services.rollout import metrics as rollout_metrics
from services.rollout.backend import TorchEngineLoader
from services.rollout.config import RolloutConfig
from services.rollout.core import EngineLoader, RolloutCore, RolloutSettings
from services.rollout.engine_types import EngineCallLog
from services.rollout.episode_channel import RedisEpisodeChannel
from services.rollout.hybrid_backend import TorchHybridTrainer
from services.rollout.servicer import RolloutServicer
from services.rollout.store import RedisRolloutStore
from services.rollout.weight_fetcher import WeightFetcher, WeightSource

logger = logging.getLogger("services.rollout")
REDIS_RETRIES = 20  # per command, with the backoff below: ~15 s


def engine_loader(cfg: RolloutConfig) -> EngineLoader:
    """The engine backend named by ``cfg.engine`` (vLLM is imported only when chosen)."""
    if cfg.engine == "torch":
        return TorchEngineLoader(cfg.num_threads, cfg.seed)
    if cfg.engine == "vllm":
        # Imported only when chosen: vLLM is an optional extra.
        from services.rollout.vllm_engine import (
            VllmEngineLoader,
            VllmEngineOptions,
            import_vllm,
        )

        import_vllm()  # fail at start-up, naming the extra to install, not at the first job
        return VllmEngineLoader(VllmEngineOptions(
            tensor_parallel_size=cfg.vllm_tensor_parallel_size, dtype=cfg.vllm_dtype,
            max_num_seqs=cfg.max_batch_size, enforce_eager=cfg.vllm_enforce_eager,
            gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, seed=cfg.seed))
    raise ValueError(f"config engine: expected torch or vllm, got {cfg.engine!r}")


def engine_calls(loader: EngineLoader) -> EngineCallLog | None:
    """The torch engines' call log (vLLM batches continuously: its calls are not logged)."""
    return loader.calls if isinstance(loader, TorchEngineLoader) else None


def context_usage(loader: EngineLoader,
                  max_batch_size: int) -> rollout_metrics.ContextUsage | None:
    """The engine's context use for /metrics: read from the torch engines' call log;
    None for vLLM (its KV cache stats stay inside its own engine process)."""
    if not isinstance(loader, TorchEngineLoader):
        return None
    return rollout_metrics.logged_context_usage(
        loader.calls, lambda: loader.context_limit_tokens, max_batch_size)


def weight_source(cfg: RolloutConfig, auth: ClientAuth) -> WeightSource:
    """The shared path, or a copy fetched from the trainer (``cfg.weights_source``)."""
    if cfg.weights_source == "filesystem":
        return WeightSource("filesystem", None)
    cache_dir = (Path(cfg.weight_cache_dir) if cfg.weight_cache_dir else
                 Path(tempfile.gettempdir()) / "libra-weights" / cfg.instance_id)
    client = GrpcWeightClient(cfg.peers.trainer, cfg.peers.rpc_timeout_s, auth=auth)
    return WeightSource(cfg.weights_source, WeightFetcher(client, cache_dir))


def worker_role(value: str) -> t.WorkerRole:
    """The lease role a rollout instance may take: core-rollout or hybrid-rollout."""
    allowed = (t.WorkerRole.CORE_ROLLOUT, t.WorkerRole.HYBRID_ROLLOUT)
    role = next((r for r in allowed if r.value == value), None)
    if role is None:
        raise ValueError(f"config role: expected one of {[r.value for r in allowed]}, "
                         f"got {value!r}")
    return role


async def main(cfg: RolloutConfig) -> None:
    # A supervised Redis killed and restarted is back in about a second: each command
    # rides that out (backoff 0.05 s doubling to 1 s, ~15 s in all) instead of ending
    # the loop and the process. Safe to repeat: publishes are idempotent per trajectory
    # id, hand-offs apply only while still assigned here, the rest are reads and sets.
    redis = redis_client(cfg.redis_url, decode_responses=False,
                              retry=Retry(ExponentialBackoff(cap=1.0, base=0.05),
                                          REDIS_RETRIES))
    peers = cfg.peers
    auth = ClientAuth.for_service(cfg.auth)
    loader = engine_loader(cfg)
    settings = RolloutSettings(
        instance_id=cfg.instance_id, bucket=cfg.bucket, max_batch_size=cfg.max_batch_size,
        max_trajectories=cfg.max_trajectories, lease_ttl_ms=cfg.lease_ttl_ms,
        tool_deadline_s=cfg.tool_deadline_s, weight_load_deadline_s=cfg.weight_load_deadline_s,
        role=worker_role(cfg.role))
    core = RolloutCore(
        settings, RedisRolloutStore(redis), loader,
        GrpcToolGatewayClient(peers.toolgateway, peers.rpc_timeout_s, auth=auth),
        GrpcSchedulerClient(peers.scheduler, peers.rpc_timeout_s,
                            linger_s=cfg.report_linger_ms / 1000,
                            max_unanswered=cfg.report_max_unanswered, auth=auth),
        GrpcCoordinatorClient(peers.coordinator, peers.rpc_timeout_s, auth=auth), SystemClock(),
        opener=GrpcGradientChannel(auth),
        load_trainer=lambda snapshot: TorchHybridTrainer(snapshot, cfg.num_threads),
        episodes=RedisEpisodeChannel(redis, SystemClock()),
        weight_source=weight_source(cfg, auth))

    rollout_metrics.register(core, context_usage(loader, cfg.max_batch_size))

    async def register(server: Server) -> None:
        host = cfg.advertise_host or cfg.server.host
        core.settings = dataclasses.replace(settings, address=f"{host}:{server.port}")
        await core.register(wait_s=peers.startup_wait_s)

    name = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
    registration = Registration(rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
                                RolloutServicer(core, engine_calls(loader)), name)
    await serve("rollout", cfg.server, [registration], run=core.run, drain=core.drain,
                on_started=register, health_probe=redis.ping, auth=cfg.auth)
    await redis.aclose()


if __name__ == "__main__":
    config = load_config(RolloutConfig, "rollout", description=__doc__)
    init_logging(config.instance_id, config.telemetry)
    init_tracing(config.instance_id, config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    keep_freed_buffers()  # weight chunks reuse heap buffers, not fresh mmaps (see module)
    asyncio.run(main(config))
