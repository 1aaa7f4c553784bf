"""The OpenTelemetry environment conventions, read (libra/otlp_config.py), and the
samplers they make (libra/telemetry.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import Decision

from libra import telemetry, tracing
from libra.errors import InvalidArgument
from libra.otlp_config import (
    BatchSettings,
    OtlpSettings,
    SamplerSettings,
    read_batch,
    read_sampler,
    read_settings,
    sdk_disabled,
)


def settings(env: dict[str, str], configured: str = "") -> OtlpSettings | None:
    return read_settings(configured, env, default_timeout_s=5.0)


def test_no_endpoint_anywhere_means_no_export() -> None:
    assert settings({"OTEL_EXPORTER_OTLP_HEADERS": "a=b"}) is None


@pytest.mark.parametrize(("configured", "env", "target", "tls", "variable"), [
    ("collector:4317", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://x:1"}, "collector:4317",
     False, "telemetry.otlp_endpoint"),
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://generic:1",
          "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:2/"}, "traces:2", False,
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://api.example.com"}, "api.example.com:443",
     True, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector"}, "collector:4317", False,
     "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
          "OTEL_EXPORTER_OTLP_INSECURE": "False"}, "collector:4317", True,
     "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",  # the scheme decides
          "OTEL_EXPORTER_OTLP_INSECURE": "false"}, "collector:4317", False,
     "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ("[::1]:4317", {}, "[::1]:4317", False, "telemetry.otlp_endpoint"),
])
def test_endpoint_precedence_scheme_and_transport(
        configured: str, env: dict[str, str], target: str, tls: bool, variable: str) -> None:
    read = settings(env, configured)
    assert read is not None
    assert (read.target, read.tls, read.endpoint_variable) == (target, tls, variable)


def test_headers_compression_timeout_signal_variables_win() -> None:
    read = settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:1",
                     "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0k,x-team = rl",
                     "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
                     "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "GZIP",
                     "OTEL_EXPORTER_OTLP_TIMEOUT": "2500"})
    assert read is not None
    assert read.headers == (("authorization", "Bearer t0k"), ("x-team", "rl"))
    assert read.gzip
    assert read.timeout_s == 2.5  # the specification's unit is milliseconds
    unset = settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:1"})
    assert unset is not None and (unset.headers, unset.gzip, unset.timeout_s) == ((), False, 5.0)


def test_a_certificate_means_tls_and_the_files_are_read(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    read = settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:1",
                     "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": str(ca)})
    assert read is not None and read.tls and read.ca_pem == ca.read_bytes()


@pytest.mark.parametrize(("env", "variable"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc://c:1"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "c:port"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ({"OTEL_EXPORTER_OTLP_INSECURE": "maybe"}, "OTEL_EXPORTER_OTLP_INSECURE"),
    ({"OTEL_EXPORTER_OTLP_HEADERS": "a=b,novalue"}, "OTEL_EXPORTER_OTLP_HEADERS"),
    ({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "bad key=1"}, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent.pem"}, "OTEL_EXPORTER_OTLP_CERTIFICATE"),
    ({"OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem"}, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
    ({"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/c.pem"},
     "OTEL_EXPORTER_OTLP_CLIENT_KEY"),
])
def test_a_bad_value_names_its_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:1", **env})
    assert refused.value.field == variable


def test_a_file_that_is_not_pem_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "key.der"
    key.write_bytes(b"\x30\x82")
    with pytest.raises(InvalidArgument, match="not a PEM file") as refused:
        settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "c:1", "OTEL_EXPORTER_OTLP_CLIENT_KEY":
                  str(key), "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(key)})
    assert refused.value.field == "OTEL_EXPORTER_OTLP_CLIENT_KEY"


@pytest.mark.parametrize(("env", "library", "trajectories"), [
    ({}, "parentbased_always_off", None),
    ({"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, "parentbased_always_on", 1.0),
    ({"OTEL_TRACES_SAMPLER": "always_off"}, "always_off", 0.0),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
     "parentbased_traceidratio", 0.25),
    ({"OTEL_TRACES_SAMPLER": "TraceIdRatio"}, "traceidratio", 1.0),  # no arg: 1.0
    ({"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "x"}, "always_on", 1.0),
])
def test_the_sampler_variable_maps_onto_both_kinds_of_spans(
        env: dict[str, str], library: str, trajectories: float | None) -> None:
    read = read_sampler(env)
    assert (read.library_sampler, read.trajectory_ratio) == (library, trajectories)


@pytest.mark.parametrize(("env", "variable"), [
    ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
     "OTEL_TRACES_SAMPLER_ARG"),
    ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
     "OTEL_TRACES_SAMPLER_ARG"),
])
def test_a_bad_sampler_names_its_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        read_sampler(env)
    assert refused.value.field == variable


def test_sdk_disabled_is_true_only_for_true(caplog: pytest.LogCaptureFixture) -> None:
    assert sdk_disabled({"OTEL_SDK_DISABLED": "True"})
    assert not sdk_disabled({}) and not sdk_disabled({"OTEL_SDK_DISABLED": "false"})
    with caplog.at_level(logging.WARNING):
        assert not sdk_disabled({"OTEL_SDK_DISABLED": "yes"})
    assert "OTEL_SDK_DISABLED" in caplog.text


def test_library_spans_by_default_only_under_a_sampled_caller() -> None:
    sampler = telemetry.library_sampler(SamplerSettings())
    assert sampler.should_sample(None, 1, "GET").decision is Decision.DROP
    for sampled, decision in ((True, Decision.RECORD_AND_SAMPLE), (False, Decision.DROP)):
        caller = trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(
            7, 9, is_remote=True, trace_flags=trace.TraceFlags(int(sampled)))))
        assert sampler.should_sample(caller, 7, "GET").decision is decision
    every = telemetry.library_sampler(SamplerSettings("parentbased_always_on"))
    assert every.should_sample(None, 1, "GET").decision is Decision.RECORD_AND_SAMPLE
    ratio = telemetry.library_sampler(SamplerSettings("traceidratio", 0.5))
    assert ratio.should_sample(None, 1, "GET").decision is Decision.RECORD_AND_SAMPLE
    assert ratio.should_sample(None, (1 << 64) - 1, "GET").decision is Decision.DROP


def test_the_process_ratio_applies_where_the_job_leaves_sampling_automatic() -> None:
    try:
        tracing.set_process_sample_ratio(0.25)
        assert tracing.effective_sample_ratio(-1.0, 1000) == 0.25
        assert tracing.effective_sample_ratio(0.5, 1000) == 0.5  # the job's own wins
    finally:
        tracing.set_process_sample_ratio(None)
    assert tracing.effective_sample_ratio(-1.0, 1000) == 64 / 1000


def test_sdk_sink_keeps_step_spans_whatever_the_library_sampler() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from libra.trace_export import OtelSpanSink

    memory = InMemorySpanExporter()
    provider = TracerProvider(sampler=telemetry.library_sampler(SamplerSettings()))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    sink = OtelSpanSink(provider)
    assert sink.record(tracing.SpanRecord("trainer.step", "", 0, 1))
    with provider.get_tracer("library").start_as_current_span("GET"):
        pass
    assert [s.name for s in memory.get_finished_spans()] == ["trainer.step"]


def test_batching_variables() -> None:
    assert read_batch({}) == BatchSettings(2.0, 8192, 512)
    assert read_batch({"OTEL_BSP_SCHEDULE_DELAY": "5000", "OTEL_BSP_MAX_QUEUE_SIZE": "100"}
                      ) == BatchSettings(5.0, 100, 100)  # a batch fits in the queue
    assert read_batch({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}).batch_size == 64


@pytest.mark.parametrize(("env", "variable"), [
    ({"OTEL_BSP_SCHEDULE_DELAY": "-1"}, "OTEL_BSP_SCHEDULE_DELAY"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "1.5"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "10", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "20"},
     "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
])
def test_a_bad_batching_value_names_its_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        read_batch(env)
    assert refused.value.field == variable
