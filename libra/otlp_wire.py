"""OTLP trace protobuf bytes, written by hand (pure: no protobuf import).

Building ``opentelemetry.proto`` message objects cost ~17 us per trajectory span (a
Span, a KeyValue and an AnyValue per attribute: about twenty Python-level message
constructions); writing the wire format directly costs a few, and most attributes
repeat (instance, bucket, finish reason, job id), so an attribute's encoded bytes are
cached. The field numbers are OTLP's (opentelemetry/proto/trace/v1/trace.proto,
common/v1/common.proto); tests decode every shape with the official classes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

# Wire types: VARINT 0, I64 1, LEN 2, I32 5; a tag is (field << 3) | wire type.
_SPAN_TRACE_ID = b"\x0a\x10"  # 1, LEN, always 16 bytes
_SPAN_SPAN_ID = b"\x12\x08"  # 2, LEN, always 8 bytes
_SPAN_PARENT_SPAN_ID = b"\x22\x08"  # 4, LEN, 8 bytes
_SPAN_NAME = b"\x2a"  # 5, LEN
_SPAN_KIND_INTERNAL = b"\x30\x01"  # 6, VARINT: SPAN_KIND_INTERNAL
_SPAN_START = b"\x39"  # 7, I64 (fixed64 ns)
_SPAN_END = b"\x41"  # 8, I64
_SPAN_ATTRIBUTE = 0x4A  # 9, LEN (one KeyValue)
_SPAN_LINK = b"\x6a"  # 13, LEN
_SPAN_STATUS = b"\x7a"  # 15, LEN
_SPAN_FLAGS = b"\x85\x01"  # 16, I32
_LINK_FLAGS = b"\x35"  # 6, I32
_STATUS_MESSAGE = b"\x12"  # 2, LEN
_STATUS_CODE_ERROR = b"\x18\x02"  # 3, VARINT: STATUS_CODE_ERROR
_KEY = b"\x0a"  # KeyValue.key 1, LEN
_VALUE = b"\x12"  # KeyValue.value 2, LEN (an AnyValue)
_STRING, _BOOL, _INT, _DOUBLE = b"\x0a", b"\x10", b"\x18", b"\x21"  # AnyValue 1-4
_LEN_FIELD_1 = b"\x0a"  # Resource.attributes, ResourceSpans.resource, ScopeSpans.scope,
#                         InstrumentationScope.name, ExportTraceServiceRequest.resource_spans
_LEN_FIELD_2 = b"\x12"  # ResourceSpans.scope_spans, ScopeSpans.spans

# The SDK's span flags: whether the parent (or a link's span) is remote is known, and is.
FLAGS_HAS_IS_REMOTE = 0x100
FLAGS_IS_REMOTE = 0x200

_SMALL_VARINTS = [bytes([n]) for n in range(0x80)]
_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE_PACK = struct.Struct("<d").pack

# Encoded attribute fields by (key, type, value); cleared when it grows past this many
# (unique values, like trajectory ids, would otherwise accumulate).
_MAX_CACHED_ATTRIBUTES = 4096
_attribute_cache: dict[tuple[str, type, Any], bytes] = {}


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (a negative int64 as its 64-bit two's complement)."""
    if 0 <= value < 0x80:
        return _SMALL_VARINTS[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def attribute(key: str, value: Any) -> bytes:
    """One Span.attributes field (tag, length, KeyValue): cached, most values repeat."""
    cache_key = (key, type(value), value)
    cached = _attribute_cache.get(cache_key)
    if cached is None:
        if len(_attribute_cache) >= _MAX_CACHED_ATTRIBUTES:
            _attribute_cache.clear()
        cached = bytes([_SPAN_ATTRIBUTE]) + _len_prefixed(key_value(key, value))
        _attribute_cache[cache_key] = cached
    return cached


def _len_prefixed(payload: bytes) -> bytes:
    return varint(len(payload)) + payload


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue message: str, bool, int and float values as themselves, others as
    their text (bool first: a bool is an int in Python, not in OTLP)."""
    if isinstance(value, bool):
        any_value = _BOOL + (b"\x01" if value else b"\x00")
    elif isinstance(value, int) and -(1 << 63) <= value < 1 << 63:
        any_value = _INT + varint(value)
    elif isinstance(value, float):
        any_value = _DOUBLE + _DOUBLE_PACK(value)
    else:
        any_value = _len_field(_STRING, str(value).encode())
    return _len_field(_KEY, key.encode()) + _len_field(_VALUE, any_value)


def span(trace_id: bytes, span_id: bytes, parent_span_id: bytes | None, name: str,
         start_ns: int, end_ns: int, attributes: Mapping[str, Any],
         links: Iterable[tuple[bytes, bytes]], error: str) -> bytes:
    """A Span message (kind INTERNAL); ``links`` are (trace id, span id) of remote spans;
    a non-empty ``error`` is an ERROR status with that message."""
    parts = [_SPAN_TRACE_ID, trace_id, _SPAN_SPAN_ID, span_id]
    if parent_span_id is not None:
        parts += (_SPAN_PARENT_SPAN_ID, parent_span_id)
    parts += (_len_field(_SPAN_NAME, name.encode()), _SPAN_KIND_INTERNAL,
              _SPAN_START, _FIXED64(start_ns), _SPAN_END, _FIXED64(end_ns))
    parts += [attribute(key, value) for key, value in attributes.items()]
    for link_trace_id, link_span_id in links:
        parts.append(_len_field(_SPAN_LINK, b"".join((
            _SPAN_TRACE_ID, link_trace_id, _SPAN_SPAN_ID, link_span_id,
            _LINK_FLAGS, _FIXED32(FLAGS_HAS_IS_REMOTE | FLAGS_IS_REMOTE)))))
    if error:
        parts.append(_len_field(_SPAN_STATUS, _len_field(_STATUS_MESSAGE, error.encode())
                                + _STATUS_CODE_ERROR))
    flags = FLAGS_HAS_IS_REMOTE | (FLAGS_IS_REMOTE if parent_span_id is not None else 0)
    parts += (_SPAN_FLAGS, _FIXED32(flags))
    return b"".join(parts)


def resource(attributes: Mapping[str, Any]) -> bytes:
    """A Resource message (its attributes)."""
    return b"".join(_len_field(_LEN_FIELD_1, key_value(k, v)) for k, v in attributes.items())


def export_request(resource_message: bytes, scope_name: str, spans: Iterable[bytes]
                   ) -> bytes:
    """An ExportTraceServiceRequest: one ResourceSpans with one ScopeSpans of ``spans``."""
    scope = _len_field(_LEN_FIELD_1, scope_name.encode())
    scope_spans = _len_field(_LEN_FIELD_1, scope) + b"".join(
        _len_field(_LEN_FIELD_2, encoded) for encoded in spans)
    resource_spans = (_len_field(_LEN_FIELD_1, resource_message)
                      + _len_field(_LEN_FIELD_2, scope_spans))
    return _len_field(_LEN_FIELD_1, resource_spans)
