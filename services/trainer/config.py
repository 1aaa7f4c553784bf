"""Trainer configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.config import knob
from libra.service_config import AuthConfig, PeersConfig, ServerConfig, TelemetryConfig

PARALLELISM_CHOICES = ("auto", "ddp", "fsdp2")


@dataclass(frozen=True, kw_only=True, slots=True)
class RendezvousConfig:
    """Where the ranks of a data-parallel job meet (a torch.distributed TCPStore)."""

    address: str = knob(
        "", "host:port of the ranks' rendezvous, opened by rank 0 (this service) on that port"
        " for every job. Empty: 127.0.0.1 on a free port, and ranks 1..N-1 are spawned here"
        " (one machine). Set: ranks 1..N-1 are separate processes, on any host, started with"
        " `python -m services.trainer.rank` and only this address (docs/operations.md)")
    timeout_s: float = knob(
        300.0, "how long rank 0 waits for every rank to join (then the job fails naming the"
               " address and the missing ranks); also the collectives' timeout")

    def __post_init__(self) -> None:
        if self.address:
            host, _, port = self.address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"rendezvous.address must be host:port, got {self.address!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"rendezvous.timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightServeConfig:
    """Serving published versions over gRPC to rollout instances without a shared
    filesystem (docs/weights.md). The fault_* options inject faults, for drills."""

    max_streams: int = knob(
        4, "weight chunk streams served at once; more are refused (RESOURCE_EXHAUSTED) and "
           "the rollout retries after a short wait, so many instances never stall the trainer")
    fault_corrupt_chunk: int = knob(-1, "fault drill: serve this chunk index corrupted "
                                        "(-1: never)")
    fault_corrupt_times: int = knob(1, "fault drill: how many times fault_corrupt_chunk is "
                                       "served corrupted")
    fault_hold_after_chunks: int = knob(
        -1, "fault drill: every stream stops after this many chunks (hangs; -1: never)")

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError(f"weights.max_streams must be >= 1, got {self.max_streams}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50053))
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    rendezvous: RendezvousConfig = field(default_factory=RendezvousConfig)
    weights: WeightServeConfig = field(default_factory=WeightServeConfig)
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
