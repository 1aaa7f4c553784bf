"""The services' OTLP export honours the OpenTelemetry environment variables, for
trajectory spans (``telemetry.build_span_sink``) and the SDK's spans
(``telemetry.build_provider``) alike.

Real: a collector's TraceService in this process over gRPC sockets (plaintext, TLS with
a certificate authority and server certificate made here with ``cryptography``, mutual
TLS), a TCP relay in front of it that counts the bytes on the wire (gzip is visible
nowhere else: the server decompresses before the handler runs).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

from libra import telemetry, tracing
from libra.errors import InvalidArgument
from libra.service_config import TelemetryConfig
from libra.tracing import SpanRecord, TraceParent

ROOT = Path(__file__).resolve().parents[3]
OTLP_VARIABLES = ("ENDPOINT", "HEADERS", "CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE",
                  "INSECURE", "COMPRESSION", "TIMEOUT")


class Collector(pb_grpc.TraceServiceServicer):
    """Keeps each request with the metadata it came with."""

    def __init__(self) -> None:
        self.received: list[tuple[pb.ExportTraceServiceRequest, dict[str, str]]] = []

    def Export(self, request, context):  # noqa: N802, ANN001
        self.received.append((request, dict(context.invocation_metadata())))
        return pb.ExportTraceServiceResponse()

    def span_names(self) -> list[str]:
        return [span.name for request, _ in self.received for res in request.resource_spans
                for scope in res.scope_spans for span in scope.spans]


@contextmanager
def collector(credentials: grpc.ServerCredentials | None = None
              ) -> Iterator[tuple[Collector, int]]:
    servicer = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = (server.add_secure_port("127.0.0.1:0", credentials) if credentials
            else server.add_insecure_port("127.0.0.1:0"))
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(grace=None)


@contextmanager
def byte_counting_relay(target_port: int) -> Iterator[tuple[int, list[int]]]:
    """A TCP relay to ``target_port``; yields its port and the count of bytes the
    client sent through it (one connection: a sender uses one channel)."""
    listener = socket.create_server(("127.0.0.1", 0))
    sent = [0]

    def pump(src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(65536):
                if count:
                    sent[0] += len(data)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:  # the other side closed first
            pass

    def serve() -> None:
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", target_port))
        back = threading.Thread(target=pump, args=(upstream, client, False), daemon=True)
        back.start()
        try:
            pump(client, upstream, True)
            back.join(timeout=10)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], sent
    finally:
        listener.close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in OTLP_VARIABLES:
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{key}", raising=False)
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_TRACES_{key}", raising=False)
    for key in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(key, raising=False)


def export_trajectory(num_spans: int = 3) -> None:
    """Spans of one trajectory through the services' sink, flushed."""
    sink = telemetry.build_span_sink("rollout-3", TelemetryConfig())
    assert sink is not None
    parent = tracing.new_traceparent(sampled=True)
    try:
        for turn in range(num_spans):
            sink.record(SpanRecord("rollout.generate", parent, turn, turn + 1,
                                   {"libra.instance": "rollout-3", "libra.turn": 1}))
        assert sink.force_flush()
    finally:
        sink.shutdown()


def test_headers_reach_the_collector_with_trajectory_and_sdk_spans(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with collector() as (received, port):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k%3D1 ,Team=rl")
        # The signal's own variable wins over the generic one.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=secret%2C2")
        export_trajectory()
        provider = telemetry.build_provider("scheduler", TelemetryConfig())
        assert provider is not None
        sampled = TraceParent.parse(tracing.new_traceparent(sampled=True))
        assert sampled is not None
        remote = trace.NonRecordingSpan(trace.SpanContext(
            sampled.trace_id, sampled.span_id, is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
        with provider.get_tracer("test").start_as_current_span(
                "/libra.proto.scheduler.v1.SchedulerService/Place",
                context=trace.set_span_in_context(remote)):
            pass
        assert provider.force_flush(timeout_millis=10_000)
        provider.shutdown()
    assert len(received.received) == 2
    for _request, metadata in received.received:
        assert metadata["x-api-key"] == "secret,2"
        assert "team" not in metadata
    assert received.span_names() == ["rollout.generate"] * 3 + [
        "/libra.proto.scheduler.v1.SchedulerService/Place"]


def test_gzip_compression_is_what_crosses_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    wire_bytes = {}
    for compression in ("none", "gzip"):
        with collector() as (received, port), byte_counting_relay(port) as (relay, sent):
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"127.0.0.1:{relay}")
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
            export_trajectory(num_spans=400)
            assert received.span_names() == ["rollout.generate"] * 400
            request_bytes = received.received[0][0].ByteSize()
        wire_bytes[compression] = sent[0]
    # 400 alike spans: the request is ~45 kB and compresses many times over; the
    # HTTP/2 and gRPC framing add well under a kilobyte.
    assert wire_bytes["none"] > request_bytes > 20_000
    assert wire_bytes["gzip"] < request_bytes / 4


def make_pki(tmp_path: Path) -> dict[str, Path]:
    """A certificate authority, a server certificate for 127.0.0.1 and a client
    certificate it signed; PEM files by name."""
    now = datetime.datetime.now(datetime.UTC)

    def issue(name: str, issuer: x509.Name | None, issuer_key: ec.EllipticCurvePrivateKey
              | None, **extensions: x509.ExtensionType) -> tuple[x509.Certificate,
                                                                ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (x509.CertificateBuilder().subject_name(subject)
                   .issuer_name(issuer or subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        for extension in extensions.values():
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(issuer_key or key, hashes.SHA256()), key

    ca, ca_key = issue("libra-test-ca", None, None,
                       basic=x509.BasicConstraints(ca=True, path_length=None))
    server, server_key = issue("127.0.0.1", ca.subject, ca_key, san=x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
    client, client_key = issue("libra-rollout", ca.subject, ca_key)
    files = {}
    for name, value in (("ca", ca), ("server", server), ("client", client)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_bytes(value.public_bytes(serialization.Encoding.PEM))
    for name, key in (("server_key", server_key), ("client_key", client_key)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return files


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual_tls"])
def test_tls_with_a_private_certificate_authority(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutual: bool) -> None:
    pki = make_pki(tmp_path)
    credentials = grpc.ssl_server_credentials(
        [(pki["server_key"].read_bytes(), pki["server"].read_bytes())],
        root_certificates=pki["ca"].read_bytes(), require_client_auth=mutual)
    with collector(credentials) as (received, port):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"https://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki["ca"]))
        if mutual:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", str(pki["client_key"]))
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", str(pki["client"]))
        export_trajectory()
        assert received.span_names() == ["rollout.generate"] * 3
        # Without the private authority's root the server's certificate is refused:
        # the batch is dropped (counted), never sent in the clear.
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_CERTIFICATE")
        sink = telemetry.build_span_sink("rollout-3", TelemetryConfig())
        assert sink is not None
        sink.record(SpanRecord("rollout.generate", tracing.new_traceparent(True), 0, 1))
        assert not sink.force_flush()
        sink.shutdown()
        assert received.span_names() == ["rollout.generate"] * 3


@pytest.mark.parametrize(("variable", "value"), [
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "api-key"),
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
    ("OTEL_TRACES_SAMPLER", "sometimes"),
])
def test_a_bad_value_stops_the_service_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4317")
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidArgument) as refused:
        telemetry.init_tracing("scheduler", TelemetryConfig())
    assert refused.value.field == variable
    assert value in str(refused.value)
    assert str(refused.value).startswith(f"{variable}: ")


def test_sdk_disabled_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4317")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "TRUE")
    assert telemetry.init_tracing("scheduler", TelemetryConfig()) is None
    assert not tracing.is_recording(tracing.new_traceparent(sampled=True))


def test_the_batch_size_variable_splits_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    with collector() as (received, port):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
        export_trajectory(num_spans=5)
    assert [sum(len(scope.spans) for res in request.resource_spans
                for scope in res.scope_spans) for request, _ in received.received] == [2, 2, 1]


PROBE = """
from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient
from opentelemetry.instrumentation.redis import RedisInstrumentor
from libra import telemetry, tracing
from libra.service_config import TelemetryConfig
assert telemetry.init_tracing("scheduler", TelemetryConfig()) is not None
print(RedisInstrumentor().is_instrumented_by_opentelemetry,
      GrpcAioInstrumentorClient().is_instrumented_by_opentelemetry,
      tracing.effective_sample_ratio(-1.0, 1000))
"""


@pytest.mark.parametrize(("sampler", "expected"), [
    ("", "False False 0.064"),  # the per-step budget: 64 of 1,000
    ("parentbased_always_off", "True True 0.0"),
    ("parentbased_always_on", "True True 1.0"),
])
def test_libraries_are_patched_only_when_a_sampler_asks_for_their_spans(
        sampler: str, expected: str) -> None:
    """A service's start (a fresh process: the patches are process-wide)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:1", "PYTHONPATH": str(ROOT)})
    if sampler:
        env["OTEL_TRACES_SAMPLER"] = sampler
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, timeout=120, check=True, cwd=ROOT)
    assert out.stdout.split("\n")[-2] == expected
