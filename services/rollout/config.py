"""Rollout instance configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.config import knob
from libra.service_config import AuthConfig, PeersConfig, ServerConfig, TelemetryConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    redis_url: str = knob("redis://127.0.0.1:6379/0", "Redis holding the inbox and results")
    instance_id: str = knob("rollout-0", "unique id of this instance (its worker id)")
    advertise_host: str = knob("", "host peers dial to reach this instance (its pod IP under "
                                   "Kubernetes, its service name under compose); empty: "
                                   "server.host")
    bucket: str = knob("short", "bucket this instance serves in")
    role: str = knob("core-rollout", "lease role: core-rollout, or hybrid-rollout to let the "
                     "elastic pool lend this instance to training (docs/elastic.md)")
    max_batch_size: int = knob(8, "most trajectories sampled together in one engine call (a "
                               "cap: each job's bucket max_batch_size binds below it)")
    max_trajectories: int = knob(16, "trajectories pinned here at once (scheduler cap)")
    lease_ttl_ms: int = knob(3000, "lease TTL asked for (the coordinator may grant more: "
                             "lease_renewals_per_s); renewed every third of the granted one")
    tool_deadline_s: float = knob(5.0, "deadline of one tool call, retries included")
    report_linger_ms: int = knob(
        0, "how long a tool-return report waits for others to share its batch on the "
        "scheduler stream (fewer messages; a MOVE lands later, mid-turn - or is moot "
        "when the trajectory finished meanwhile, so keep it well under a turn's duration)")
    report_max_unanswered: int = knob(
        8, "all-stay report batches in a row the scheduler may leave unanswered (a stay "
        "changes nothing here; 0 answers every batch, one message more each)")
    weight_load_deadline_s: float = knob(
        30.0, "deadline to fetch and verify a published policy version; past it the "
        "version is refused (error event) and the old weights keep serving")
    weights_source: str = knob(
        "auto", "where published weights and the job's model dir are read: filesystem (the "
        "shared run dir path), "
        "grpc (fetched from the trainer at peers.trainer into weight_cache_dir), or auto "
        "(the path when readable here, else grpc); docs/weights.md")
    weight_cache_dir: str = knob(
        "", "local folder for weights fetched over gRPC (empty: <tmp>/libra-weights/"
        "<instance_id>)")
    num_threads: int = knob(1, "torch intra-op threads")
    seed: int = knob(0, "sampling seed")
    engine: str = knob("torch", "inference engine: torch (built in) or vllm (optional extra: "
                       "requirements-vllm.txt / make test-vllm; docs/vllm.md)")
    vllm_tensor_parallel_size: int = knob(
        0, "vLLM tensor_parallel_size; 0 takes the tp_degree of this instance's bucket")
    vllm_dtype: str = knob("float32", "vLLM dtype: float32 on CPU; bfloat16 or auto on GPUs")
    vllm_enforce_eager: bool = knob(
        True, "vLLM without CUDA graphs/compilation: faster start; set false on GPUs")
    vllm_gpu_memory_utilization: float = knob(
        0.9, "vLLM GPU memory share for weights + KV cache (GPU only; on CPU the KV cache "
        "is VLLM_CPU_KVCACHE_SPACE GiB)")
