"""Trajectory traces (libra/tracing.py, libra/trace_export.py): the traceparent a
trajectory carries, the sampling decided at admission, and the spans the OpenTelemetry
adapter makes from it (a real SDK tracer provider, spans to an in-memory exporter).
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from libra import tracing
from libra import types as t
from libra.errors import InvalidArgument
from libra.jobspec import parse_job_spec
from libra.proto.common.v1 import common_pb2
from libra.tracing import TraceParent
from libra.wire.common import decode_trajectory, encode_trajectory


def test_traceparent_round_trips_and_malformed_values_mean_untraced() -> None:
    text = tracing.new_traceparent(sampled=True)
    parsed = TraceParent.parse(text)
    assert parsed is not None and parsed.sampled and parsed.format() == text
    unsampled = TraceParent.parse(tracing.new_traceparent(sampled=False))
    assert unsampled is not None and not unsampled.sampled
    span = "b" * 16
    for bad in ("", "00-xyz", f"01-{'a' * 32}-{span}-01", f"00-{'0' * 32}-{span}-01",
                f"00-{'A' * 32}-{span}-01"):
        assert TraceParent.parse(bad) is None, bad


def test_sampling_is_a_stable_function_of_the_trajectory_id() -> None:
    ids = [f"job:g{g}:p:s{s}" for g in range(2000) for s in range(4)]
    first = [tracing.is_sampled(i, 0.1) for i in ids]
    assert first == [tracing.is_sampled(i, 0.1) for i in ids]  # a re-admission agrees
    assert 0.08 * len(ids) < sum(first) < 0.12 * len(ids)
    assert all(tracing.is_sampled(i, 1.0) for i in ids[:100])
    assert not any(tracing.is_sampled(i, 0.0) for i in ids[:100])


def test_automatic_ratio_traces_small_jobs_fully_and_about_64_per_step_of_large_ones() -> None:
    auto = tracing.AUTO_SAMPLE_RATIO
    assert tracing.effective_sample_ratio(auto, 16) == 1.0
    assert tracing.effective_sample_ratio(auto, 64) == 1.0
    assert tracing.effective_sample_ratio(auto, 640) == pytest.approx(0.1)
    assert tracing.effective_sample_ratio(0.25, 4) == 0.25
    assert tracing.effective_sample_ratio(0.0, 4) == 0.0


def test_trace_sample_ratio_out_of_range_is_refused_naming_the_field() -> None:
    assert parse_job_spec("").observability.trace_sample_ratio == tracing.AUTO_SAMPLE_RATIO
    assert parse_job_spec("[observability]\ntrace_sample_ratio = 0.5\n"
                          ).observability.trace_sample_ratio == 0.5
    for bad in ("1.5", "-0.5", "-2.0"):
        with pytest.raises(InvalidArgument) as err:
            parse_job_spec(f"[observability]\ntrace_sample_ratio = {bad}\n")
        assert err.value.field == "observability.trace_sample_ratio"


def test_traceparent_travels_in_the_trajectory_record_and_old_records_decode() -> None:
    traj = t.Trajectory(t.TrajectoryId("j:g0:p:s0"), t.JobId("j"), t.GroupId("j:g0:p"),
                        t.PromptId("p"), "1+1", "2",
                        traceparent=tracing.new_traceparent(sampled=True))
    assert decode_trajectory(encode_trajectory(traj)).traceparent == traj.traceparent
    old = common_pb2.Trajectory(trajectory_id="j:g0:p:s1", job_id="j").SerializeToString()
    assert decode_trajectory(old).traceparent == ""


def test_without_a_sink_nothing_is_recorded() -> None:
    tracing.set_sink(None)
    parent = tracing.new_traceparent(sampled=True)
    assert tracing.record_child("x", parent, 0, 1) == ""
    assert tracing.record_span("x", 0, 1) == ""
    assert not tracing.is_recording(parent)


def test_children_and_root_share_the_ids_chosen_at_admission(
        spans: InMemorySpanExporter) -> None:
    parent = tracing.new_traceparent(sampled=True)
    root = TraceParent.parse(parent)
    assert root is not None
    child = tracing.record_child("rollout.generate", parent, 1_000, 1_250,
                                 **{"libra.tokens": 7})
    tracing.end_trajectory(parent, 900, 2_000, "trained", **{"libra.reward": 1.0})
    by_name = {s.name: s for s in spans.get_finished_spans()}
    gen, traj = by_name["rollout.generate"], by_name["trajectory"]
    assert traj.context.trace_id == root.trace_id and traj.context.span_id == root.span_id
    assert traj.parent is None
    assert gen.context.trace_id == root.trace_id and gen.parent.span_id == root.span_id
    assert child == TraceParent(root.trace_id, gen.context.span_id, True).format()
    assert (gen.start_time, gen.end_time) == (1_000 * 10**6, 1_250 * 10**6)
    assert (traj.start_time, traj.end_time) == (900 * 10**6, 2_000 * 10**6)
    assert traj.attributes["libra.outcome"] == "trained"
    assert gen.attributes["libra.tokens"] == 7
    # The forced ids were for that one span: the next root-less span gets fresh ones.
    tracing.record_span("trainer.step", 0, 1)
    step = spans.get_finished_spans()[-1]
    assert step.context.trace_id != root.trace_id


def test_unsampled_trajectories_record_nothing(spans: InMemorySpanExporter) -> None:
    parent = tracing.new_traceparent(sampled=False)
    assert tracing.record_child("tool.call", parent, 0, 1) == ""
    tracing.end_trajectory(parent, 0, 1, "trained")
    assert tracing.record_child("tool.call", "", 0, 1) == ""  # never traced
    assert spans.get_finished_spans() == ()


def test_a_step_span_links_to_the_trajectory_and_errors_set_the_status(
        spans: InMemorySpanExporter) -> None:
    parent = tracing.new_traceparent(sampled=True)
    step = tracing.record_span("trainer.step", 10, 20, links=[parent])
    tracing.end_trajectory(parent, 0, 20, "dropped_failed", error="tool gateway: down",
                           links=[step])
    step_span, traj = spans.get_finished_spans()
    root = TraceParent.parse(parent)
    assert root is not None
    assert [link.context.span_id for link in step_span.links] == [root.span_id]
    assert [link.context.span_id for link in traj.links] == [step_span.context.span_id]
    assert traj.status.status_code is StatusCode.ERROR
    assert traj.status.description == "tool gateway: down"
