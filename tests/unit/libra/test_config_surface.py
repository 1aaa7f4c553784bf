"""Frozen snapshot of every service's config options.

Adding, renaming or removing a knob must change this file too, so the change is
deliberate and shows up in review (house style: typed knob + option snapshot).
"""

from __future__ import annotations

import pytest

from libra.config import _leaf_fields, load_config, option_names
from services.coordinator.config import CoordinatorConfig
from services.rollout.config import RolloutConfig
from services.scheduler.config import SchedulerConfig
from services.toolgateway.config import ToolGatewayConfig
from services.trainer.config import TrainerConfig

SHARED = [
    "server.enable_reflection", "server.host", "server.metrics_port", "server.port",
    "server.shutdown_grace_s",
    "telemetry.log_backup_count", "telemetry.log_file", "telemetry.log_json",
    "telemetry.log_level", "telemetry.log_max_bytes", "telemetry.log_max_message_chars",
    "telemetry.log_repeat_burst", "telemetry.log_repeat_window_s", "telemetry.otlp_endpoint",
    "telemetry.trace_console",
    "auth.api_token", "auth.api_token_file", "auth.service_token", "auth.service_token_file",
    "auth.tls_ca_file", "auth.tls_cert_file", "auth.tls_key_file", "auth.tls_client_ca_file",
    "auth.tls_client_cert_file", "auth.tls_client_key_file",
]
PEERS = ["peers.coordinator", "peers.rpc_timeout_s", "peers.scheduler", "peers.startup_wait_s",
         "peers.toolgateway", "peers.trainer"]

SNAPSHOT: dict[type, list[str]] = {
    CoordinatorConfig: sorted([*SHARED, *PEERS, "http_port", "lease_renewals_per_s",
                               "max_queued_jobs",
                               "reconcile_interval_s", "redis_url",
                               "retention.ended_weight_versions", "retention.interval_s",
                               "retention.keep_last_runs",
                               "retention.max_age_days", "run_root",
                               "tool_data_roots", "trainer_lost_s"]),
    SchedulerConfig: sorted([*SHARED, *PEERS, "redis_url", "tick_s"]),
    RolloutConfig: sorted([
        *SHARED, *PEERS, "advertise_host", "bucket", "engine", "instance_id",
        "lease_ttl_ms", "max_batch_size",
        "max_trajectories", "num_threads", "redis_url", "report_linger_ms",
        "report_max_unanswered", "role", "seed",
        "tool_deadline_s",
        "vllm_dtype", "vllm_enforce_eager", "vllm_gpu_memory_utilization",
        "vllm_tensor_parallel_size", "weight_cache_dir", "weight_load_deadline_s",
        "weights_source"]),
    TrainerConfig: sorted([
        *SHARED, *PEERS, "coordinator_retry_s", "num_ranks", "num_threads", "parallelism",
        "redis_url", "rendezvous.address", "rendezvous.timeout_s",
        "weights.fault_corrupt_chunk", "weights.fault_corrupt_times",
        "weights.fault_hold_after_chunks", "weights.max_streams", "worker_id"]),
    ToolGatewayConfig: sorted([
        *SHARED, *PEERS, "calculator_transient_failure_rate", "data_roots", "extra_rewards",
        "extra_tools", "file_read_gid", "file_read_uid",
        "max_concurrency_per_tool", "max_queue_depth_per_tool", "orphan_reap_interval_s",
        "python_timeout_s", "require_network_isolation", "sandbox_num_uids", "sandbox_uid_base",
        "search_corpus"]),
}

DEFAULT_PORTS = {CoordinatorConfig: 50051, SchedulerConfig: 50052, TrainerConfig: 50053,
                 ToolGatewayConfig: 50054, RolloutConfig: 0}


@pytest.mark.parametrize("cls", list(SNAPSHOT), ids=lambda c: c.__name__)
def test_option_names_match_frozen_snapshot(cls: type) -> None:
    assert sorted(option_names(cls)) == SNAPSHOT[cls]


@pytest.mark.parametrize("cls", list(SNAPSHOT), ids=lambda c: c.__name__)
def test_every_option_has_help_text(cls: type) -> None:
    missing = [name for name, _type, help_text in _leaf_fields(cls) if not help_text.strip()]
    assert missing == []


@pytest.mark.parametrize("cls", list(SNAPSHOT), ids=lambda c: c.__name__)
def test_defaults_load_without_file_env_or_cli(cls: type) -> None:
    cfg = load_config(cls, "svc", argv=[], environ={})
    assert cfg.server.port == DEFAULT_PORTS[cls]


def test_cli_override_of_one_group_field_keeps_the_services_group_defaults() -> None:
    cfg = load_config(CoordinatorConfig, "coordinator", argv=["--server.host", "0.0.0.0"],
                      environ={})
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 50051)


def test_trainer_rank_options_match_frozen_snapshot() -> None:
    """``python -m services.trainer.rank`` (ranks 1..N-1 started on their own)."""
    from services.trainer.rank import RankConfig

    telemetry = [name for name in SHARED if name.startswith("telemetry.")]
    assert sorted(option_names(RankConfig)) == sorted([
        *telemetry, "join_timeout_s", "local_rank", "max_jobs", "rank", "rank_offset",
        "rendezvous"])
    assert all(help_text.strip() for _name, _type, help_text in _leaf_fields(RankConfig))
