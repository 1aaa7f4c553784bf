"""Scheduler configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

from libra.config import knob
from libra.service_config import AuthConfig, PeersConfig, ServerConfig, TelemetryConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class SchedulerConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50052))
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    redis_url: str = knob("redis://127.0.0.1:6379/0", "Redis holding queues and load counters")
    tick_s: float = knob(0.05, "period of the admission/placement loop")
