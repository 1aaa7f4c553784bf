"""The hand-written OTLP encoding (libra/otlp_wire.py), decoded by the official
``opentelemetry.proto`` classes: every field the trajectory spans use, every attribute
type, varints at their edges, and the attribute cache's bound."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from libra import otlp_wire

TRACE = bytes(range(16))
SPAN = bytes(range(100, 108))
PARENT = bytes(range(200, 208))


@pytest.mark.parametrize("number", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**63 - 1,
                                    -1, -128, -(2**63)])
def test_int_attributes_round_trip_at_the_varint_edges(number: int) -> None:
    decoded = KeyValue.FromString(otlp_wire.key_value("libra.n", number))
    assert decoded.key == "libra.n"
    assert decoded.value.WhichOneof("value") == "int_value"
    assert decoded.value.int_value == number


def test_each_attribute_type_keeps_its_otlp_type() -> None:
    cases = {"s": ("libra.bucket", "short"), "u": ("libra.reason", "tool \u2192 long"),
             "t": ("libra.ok", True), "f": ("libra.ok", False), "d": ("libra.reward", 0.25),
             "e": ("libra.empty", "")}
    kinds = {"s": "string_value", "u": "string_value", "t": "bool_value",
             "f": "bool_value", "d": "double_value", "e": "string_value"}
    for case, (key, value) in cases.items():
        decoded = KeyValue.FromString(otlp_wire.key_value(key, value))
        assert decoded.key == key
        assert decoded.value.WhichOneof("value") == kinds[case], case
        assert getattr(decoded.value, kinds[case]) == value
    # Beyond int64 OTLP has no integer: the value travels as its text.
    huge = KeyValue.FromString(otlp_wire.key_value("libra.big", 2**64))
    assert huge.value.string_value == str(2**64)


def test_a_child_span_with_links_and_an_error_decodes_field_by_field() -> None:
    encoded = otlp_wire.span(
        TRACE, SPAN, PARENT, "rollout.move", 1_000_000, 3_000_000,
        {"libra.to_bucket": "long", "libra.partial_turn_tokens": 17, "libra.ok": False},
        [(TRACE, PARENT), (bytes(16 * [7]), bytes(8 * [9]))], "fenced: lease lost")
    span = Span.FromString(encoded)
    assert (span.trace_id, span.span_id, span.parent_span_id) == (TRACE, SPAN, PARENT)
    assert span.name == "rollout.move" and span.kind == Span.SPAN_KIND_INTERNAL
    assert (span.start_time_unix_nano, span.end_time_unix_nano) == (1_000_000, 3_000_000)
    assert [(a.key, a.value.WhichOneof("value")) for a in span.attributes] == [
        ("libra.to_bucket", "string_value"), ("libra.partial_turn_tokens", "int_value"),
        ("libra.ok", "bool_value")]
    assert [(link.trace_id, link.span_id, link.flags) for link in span.links] == [
        (TRACE, PARENT, 0x300), (bytes(16 * [7]), bytes(8 * [9]), 0x300)]
    assert span.status.code == Status.STATUS_CODE_ERROR
    assert span.status.message == "fenced: lease lost"
    assert span.flags == 0x300  # the parent is remote, and that is known (as the SDK says)


def test_a_root_span_has_no_parent_and_an_unset_status() -> None:
    span = Span.FromString(otlp_wire.span(TRACE, SPAN, None, "trajectory", 0, 5, {}, [], ""))
    assert span.parent_span_id == b"" and span.flags == 0x100
    assert span.status.code == Status.STATUS_CODE_UNSET and not span.HasField("status")
    assert not span.attributes and not span.links


def test_an_export_request_carries_the_resource_once_and_every_span() -> None:
    spans = [otlp_wire.span(TRACE, (i + 1).to_bytes(8, "big"), PARENT, f"span-{i}", i, i + 1,
                            {"libra.turn": i}, [], "") for i in range(300)]
    request = ExportTraceServiceRequest.FromString(otlp_wire.export_request(
        otlp_wire.resource({"service.name": "rollout-0", "telemetry.sdk.language": "python"}),
        "libra.trajectory", spans))
    [resource_spans] = request.resource_spans
    assert {a.key: a.value.string_value for a in resource_spans.resource.attributes} == {
        "service.name": "rollout-0", "telemetry.sdk.language": "python"}
    [scope] = resource_spans.scope_spans
    assert scope.scope.name == "libra.trajectory"
    assert [s.name for s in scope.spans] == [f"span-{i}" for i in range(300)]
    assert [s.attributes[0].value.int_value for s in scope.spans] == list(range(300))


def test_the_attribute_cache_is_bounded_and_stays_correct() -> None:
    for i in range(otlp_wire._MAX_CACHED_ATTRIBUTES + 10):
        otlp_wire.attribute("libra.trajectory_id", f"job:g{i}:p:s0")
    assert len(otlp_wire._attribute_cache) <= otlp_wire._MAX_CACHED_ATTRIBUTES
    # True and 1 are equal Python keys; the cache keeps their OTLP types apart.
    for value, kind in ((1, "int_value"), (True, "bool_value"), (1.0, "double_value")):
        span = Span.FromString(otlp_wire.span(TRACE, SPAN, None, "x", 0, 1,
                                              {"libra.v": value}, [], ""))
        assert span.attributes[0].value.WhichOneof("value") == kind
