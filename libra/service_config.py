"""Config groups every service shares (server, telemetry, peers, Redis, run folder)."""

from __future__ import annotations

from dataclasses import dataclass

from libra.config import knob


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerConfig:
    """The gRPC server of a service: address, ports, drain time, reflection."""

    host: str = knob("127.0.0.1", "address the gRPC server binds to")
    port: int = knob(0, "gRPC port (0 picks a free port, printed at start-up)")
    metrics_port: int = knob(0, "Prometheus /metrics port (0 picks a free port, -1 disables)")
    shutdown_grace_s: float = knob(10.0, "time to drain in-flight work after SIGTERM")
    enable_reflection: bool = knob(True, "serve gRPC server reflection")


@dataclass(frozen=True, kw_only=True, slots=True)
class TelemetryConfig:
    """Logging and tracing of a service."""

    log_level: str = knob("INFO", "log level")
    log_json: bool = knob(False, "structured JSON log lines instead of key=value text")
    otlp_endpoint: str = knob("", "OTLP gRPC endpoint for traces (host:port plaintext, "
                                  "https://host:port TLS); empty = "
                                  "OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else no export")
    trace_console: bool = knob(False, "print finished spans to stderr (debugging)")
    log_file: str = knob("", "write logs to this file, rotated by size (empty: stderr)")
    log_max_bytes: int = knob(50 * 1024 * 1024, "rotate the log file past this size")
    log_backup_count: int = knob(3, "rotated log files kept beside the current one")
    log_max_message_chars: int = knob(4096, "longer log messages are cut (client strings)")
    log_repeat_burst: int = knob(10, "records of one warning/error template per window; "
                                     "the rest are counted, not written")
    log_repeat_window_s: float = knob(60.0, "window of log_repeat_burst")


@dataclass(frozen=True, kw_only=True, slots=True)
class PeersConfig:
    """Where a service finds its peers, and its default deadline for calls to them."""

    coordinator: str = knob("127.0.0.1:50051", "coordinator gRPC address")
    scheduler: str = knob("127.0.0.1:50052", "scheduler gRPC address")
    trainer: str = knob("127.0.0.1:50053", "trainer gRPC address")
    toolgateway: str = knob("127.0.0.1:50054", "tool gateway gRPC address")
    rpc_timeout_s: float = knob(10.0, "default deadline of a call to a peer")
    startup_wait_s: float = knob(120.0, "at start, how long to wait for a peer this service "
                                 "registers with (the coordinator) to answer")


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthConfig:
    """Credentials and TLS files (docs/operations.md, "Security"). A token may be given
    inline or as a file path; the file wins. Auth is on when any token is set, and
    required when ``server.host`` is not a loopback address."""

    api_token: str = knob("", "bearer token of the public job API (gRPC job methods, REST)")
    api_token_file: str = knob("", "file holding api_token (one line)")
    service_token: str = knob("", "bearer token of the internal RPCs between services "
                              "(also accepted on the public API); sent to peers")
    service_token_file: str = knob("", "file holding service_token (one line)")
    tls_cert_file: str = knob("", "PEM server certificate: gRPC (and REST) serve TLS")
    tls_key_file: str = knob("", "PEM private key of tls_cert_file")
    tls_ca_file: str = knob("", "PEM CA bundle: clients verify peers with it (TLS to peers)")
    tls_client_ca_file: str = knob("", "PEM CA of client certificates: the gRPC server then "
                                   "requires one signed by it from every caller (mutual TLS)")
    tls_client_cert_file: str = knob("", "PEM client certificate sent to peers (mutual TLS)")
    tls_client_key_file: str = knob("", "PEM private key of tls_client_cert_file")
