"""Trainer service: warm start, then async GRPO on complete groups; publishes
checkpointed, checksummed policy versions. Run: ``python -m services.trainer``.

Every option can also come from LIBRA_TRAINER_<OPTION> (groups joined by __)
or from a TOML file given with --config."""

from __future__ import annotations

import asyncio
import logging

from libra.allocator import keep_freed_buffers
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.clock import SystemClock
from libra.config import load_config, redact
from libra.grpc_auth import ClientAuth
from libra.grpcx import Registration, serve
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from libra.redis_connect import redis_client
from libra.retry import RetryPolicy
from libra.telemetry import init_logging, init_tracing
from services.trainer.config import TrainerConfig
from services.trainer.core import TrainerCore
from services.trainer.job_series import run_series_pruning
from services.trainer.lazy_backend import LazyBackendFactory
from services.trainer.servicer import GradientChannelServicer, TrainerServicer
from services.trainer.store import RedisTrainerStore
from services.trainer.weight_server import WeightFaults, WeightServer
from services.trainer.weight_servicer import WeightServicer

logger = logging.getLogger("services.trainer")


async def main(cfg: TrainerConfig) -> None:
    redis = redis_client(cfg.redis_url, decode_responses=False)
    store = RedisTrainerStore(redis)
    w = cfg.weights
    weights = WeightServer(store.job_run_dir, w.max_streams, WeightFaults(
        corrupt_chunk=w.fault_corrupt_chunk, corrupt_times=w.fault_corrupt_times,
        hold_after_chunks=w.fault_hold_after_chunks))
    factory = LazyBackendFactory(cfg.num_threads, cfg.num_ranks, cfg.parallelism,
                                 cfg.rendezvous.address, cfg.rendezvous.timeout_s)
    core = TrainerCore(store, factory,
                       GrpcCoordinatorClient(cfg.peers.coordinator, cfg.peers.rpc_timeout_s,
                                             auth=ClientAuth.for_service(cfg.auth)),
                       SystemClock(), consumer=cfg.worker_id,
                       report_retry=RetryPolicy(give_up_after_s=cfg.coordinator_retry_s),
                       weight_pins=weights.pinned)
    name = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name
    registration = Registration(trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
                                TrainerServicer(core), name)
    channel = Registration(trainer_pb2_grpc.add_GradientChannelServicer_to_server,
                           GradientChannelServicer(core),
                           trainer_pb2.DESCRIPTOR.services_by_name["GradientChannel"].full_name)
    served = Registration(trainer_pb2_grpc.add_WeightServiceServicer_to_server,
                          WeightServicer(weights),
                          trainer_pb2.DESCRIPTOR.services_by_name["WeightService"].full_name)
    # A job still RUNNING lost its trainer (this process was restarted): take it up.
    await core.resume()
    pruning = asyncio.create_task(run_series_pruning(store))
    try:
        await serve("trainer", cfg.server, [registration, channel, served], drain=core.drain,
                    health_probe=redis.ping, auth=cfg.auth)
    finally:
        pruning.cancel()
    await redis.aclose()


if __name__ == "__main__":
    config = load_config(TrainerConfig, "trainer", description=__doc__)
    init_logging(config.worker_id, config.telemetry)
    init_tracing(config.worker_id, config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    keep_freed_buffers()  # weight chunks reuse heap buffers, not fresh mmaps (see module)
    asyncio.run(main(config))
