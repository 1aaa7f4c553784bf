"""Coordinator configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.config import knob
from libra.service_config import PeersConfig, ServerConfig, TelemetryConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class CoordinatorConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50051))
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    redis_url: str = knob("redis://127.0.0.1:6379/0", "Redis holding jobs, leases, queues")
    run_root: str = knob("runs", "folder under which each job gets its run folder")
    http_port: int = knob(8080, "REST API port (OpenAPI at /docs); -1 disables")
