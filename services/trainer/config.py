"""Trainer configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.config import knob
from libra.service_config import AuthConfig, PeersConfig, ServerConfig, TelemetryConfig

PARALLELISM_CHOICES = ("auto", "ddp", "fsdp2")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50053))
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    redis_url: str = knob("redis://127.0.0.1:6379/0", "Redis holding the trajectory stream")
    worker_id: str = knob("trainer-0", "consumer name in the trajectory stream's group")
    num_threads: int = knob(1, "torch intra-op threads")
    num_ranks: int = knob(1, "data-parallel training ranks; 1 trains in this process, N > 1"
                             " spawns N - 1 worker processes per job (one per GPU on CUDA)")
    parallelism: str = knob(
        "auto", "with num_ranks > 1: ddp (whole model per rank, gradients all-reduced), fsdp2"
        " (fully_shard per decoder layer: parameters and optimizer state split over ranks) or"
        " auto (fsdp2 on CUDA over NCCL, ddp on CPU over gloo)")

    coordinator_retry_s: float = knob(
        600.0, "how long a step or job-done report is retried (backoff 0.1 s doubling to 2 s)"
        " while the coordinator is unreachable; past it the job fails. A coordinator"
        " restart within it only delays the step loop")

    def __post_init__(self) -> None:
        if self.coordinator_retry_s < 0:
            raise ValueError(f"coordinator_retry_s must be >= 0, got {self.coordinator_retry_s}")
        if self.parallelism not in PARALLELISM_CHOICES:
            raise ValueError(f"parallelism must be one of {PARALLELISM_CHOICES}, "
                             f"got {self.parallelism!r}")
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
