"""Coordinator configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.config import knob
from libra.data_roots import DEFAULT_DATA_ROOTS
from libra.service_config import AuthConfig, PeersConfig, ServerConfig, TelemetryConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class RetentionConfig:
    """Disk retention of ended jobs' run folders (libra/retention.py has the rules;
    ``libra gc`` applies the same ones by hand)."""

    interval_s: float = knob(3600.0, "how often run folders under run_root are checked "
                             "(also once a minute after start-up)")
    max_age_days: float = knob(0.0, "delete the run folder of a job that ended longer ago "
                               "than this; 0 keeps run folders forever")
    keep_last_runs: int = knob(5, "the most recently ended runs are kept whatever their age")
    ended_weight_versions: int = knob(1, "weight versions kept in an ended job's run "
                                      "folder (newest first; its checkpoints stay); 0 keeps all")

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"retention.interval_s must be > 0, got {self.interval_s}")
        for name in ("max_age_days", "keep_last_runs", "ended_weight_versions"):
            if getattr(self, name) < 0:
                raise ValueError(f"retention.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CoordinatorConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50051))
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    redis_url: str = knob("redis://127.0.0.1:6379/0", "Redis holding jobs, leases, queues")
    run_root: str = knob("runs", "folder under which each job gets its run folder")
    http_port: int = knob(8080, "REST API port (OpenAPI at /docs); -1 disables")
    reconcile_interval_s: float = knob(
        5.0, "how often jobs PENDING or RUNNING are checked against the trainer's status"
        " (also once at start-up): one no trainer works on is resumed or ended")
    trainer_lost_s: float = knob(
        60.0, "a trainer unreachable this long is taken for gone: its running job fails")
    lease_renewals_per_s: float = knob(
        250.0, "lease renewals per second the fleet may send: a lease's TTL is raised to "
        "at least 3 s x workers / this (holders renew every third of it), so up to 250 "
        "workers keep the TTL they ask for and 1,000 get 12 s; the price is failure "
        "detection (a dead worker's work waits that long); 0 keeps the asked TTL")
    max_queued_jobs: int = knob(
        100, "jobs that may wait in the queue while one runs; a submit beyond it is "
        "refused (RESOURCE_EXHAUSTED / HTTP 429)")
    tool_data_roots: list[str] = knob(
        list(DEFAULT_DATA_ROOTS), "folders a job's tool files (tools.search_corpus) must lie "
        "in, checked at submit (symlinks and '..' resolved); keep equal to the tool "
        "gateway's data_roots")

    def __post_init__(self) -> None:
        if self.reconcile_interval_s <= 0:
            raise ValueError(f"reconcile_interval_s must be > 0, got "
                             f"{self.reconcile_interval_s}")
        if self.lease_renewals_per_s < 0:
            raise ValueError(f"lease_renewals_per_s must be >= 0, got "
                             f"{self.lease_renewals_per_s}")
        if self.max_queued_jobs < 0:
            raise ValueError(f"max_queued_jobs must be >= 0, got {self.max_queued_jobs}")
        if self.trainer_lost_s < 0:
            raise ValueError(f"trainer_lost_s must be >= 0, got {self.trainer_lost_s}")
