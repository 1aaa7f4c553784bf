"""Tool gateway configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from libra.config import knob
from libra.data_roots import DEFAULT_DATA_ROOTS
from libra.service_config import AuthConfig, PeersConfig, ServerConfig, TelemetryConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolGatewayConfig:
    server: ServerConfig = field(default_factory=lambda: ServerConfig(port=50054))
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    peers: PeersConfig = field(default_factory=PeersConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    max_concurrency_per_tool: int = knob(8, "calls of one tool running at once")
    max_queue_depth_per_tool: int = knob(64, "calls waiting for a slot before "
                                             "RESOURCE_EXHAUSTED")
    calculator_transient_failure_rate: float = knob(
        0.25, "share of calculator calls that fail with 'busy' (a flaky tool, by call id)")
    python_timeout_s: float = knob(10.0, "wall-clock limit of one sandboxed python call")
    search_corpus: list[str] = knob([], "text files indexed by the search tool (BM25); "
                                        "each must lie inside data_roots")
    data_roots: list[str] = knob(list(DEFAULT_DATA_ROOTS), "the only folders tools read "
                                 "files from (job search corpora); symlinks and '..' are "
                                 "resolved before the check")
    file_read_uid: int = knob(65534, "uid that opens a job's files (search corpora) when the "
                              "gateway runs as root, so only files that uid may read are "
                              "served (default nobody); -1 opens them as the gateway")
    file_read_gid: int = knob(65534, "gid of file_read_uid (no supplementary groups)")
    extra_tools: list[str] = knob([], "plugin tools by dotted path (module:Name)")
    extra_rewards: list[str] = knob([], "plugin rewards by dotted path (module:Name)")
    require_network_isolation: bool = knob(False, "refuse to start without a network "
                                                  "namespace for sandboxed code")
    sandbox_uid_base: int = knob(990_000, "first uid (and gid) of the pool sandboxed code "
                                 "runs as when the gateway is root; gateways sharing a host "
                                 "need disjoint ranges (a uid's processes may signal each "
                                 "other and share RLIMIT_NPROC)")
    sandbox_num_uids: int = knob(256, "uids in that pool (calls running at once, at most)")
    orphan_reap_interval_s: float = knob(5.0, "how often, between calls, the gateway reaps "
                                         "the exited leftovers of its tools' calls (each "
                                         "holds a pid and keeps its uid out of the pool "
                                         "until reaped)")

    def __post_init__(self) -> None:
        if self.file_read_uid == 0 or self.file_read_uid < -1 or self.file_read_gid < -1:
            raise ValueError(f"file_read_uid/file_read_gid must be an unprivileged id (> 0) "
                             f"or -1 (read as the gateway), got {self.file_read_uid}/"
                             f"{self.file_read_gid}")
        if self.sandbox_uid_base <= 0 or self.sandbox_num_uids <= 0:
            raise ValueError(f"sandbox_uid_base and sandbox_num_uids must be > 0, got "
                             f"{self.sandbox_uid_base}/{self.sandbox_num_uids}")
        if not (math.isfinite(self.orphan_reap_interval_s)
                and self.orphan_reap_interval_s > 0):
            raise ValueError(f"orphan_reap_interval_s must be a number of seconds > 0, "
                             f"got {self.orphan_reap_interval_s}")
