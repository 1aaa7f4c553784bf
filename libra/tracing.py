"""Trajectory traces: the trace context a trajectory carries, and the port services
record its spans through (pure: no OpenTelemetry import; the adapter is
``libra.trace_export``).

One trace per trajectory. Its root span ("trajectory") is created, as an id, at
admission: the scheduler writes a W3C ``traceparent`` (``00-<trace id>-<root span
id>-<flags>``) on the record, which carries it through Redis and gRPC to every service.
Spans cannot cross processes, so each service records its own finished spans as children
of that root, with explicit start and end times (turns, tool calls, decisions, moves,
publish, train), and the service that ends the trajectory (the trainer, when it trains
on it or drops it) emits the root span itself, with the ids the traceparent names and the
admission time as its start. Whether a trajectory is traced is decided once, at
admission, and travels as the traceparent's sampled flag, so all services agree.

Cores call :func:`record_child` and :func:`end_trajectory`; with no exporter installed
(:func:`set_sink` never called) both return at once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

AttributeValue = str | int | float | bool

# ``trace_sample_ratio`` below 0 means "choose for me": every trajectory while a step
# trains on at most this many, else a ratio that traces about this many per step.
AUTO_SAMPLE_RATIO = -1.0
FULL_TRACE_MAX_TRAJECTORIES_PER_STEP = 64

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A W3C trace context: the trace, the span that is the parent, the sampled flag."""

    trace_id: int
    span_id: int
    sampled: bool

    def format(self) -> str:
        """The ``traceparent`` header form (version 00)."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    @classmethod
    def parse(cls, text: str) -> TraceParent | None:
        """The context ``text`` names; None for "" (untraced) or a malformed value, which
        is treated as untraced rather than refused (a trace is never worth a trajectory)."""
        match = _TRACEPARENT.fullmatch(text)
        if match is None:
            return None
        trace_id, span_id = int(match[1], 16), int(match[2], 16)
        if not trace_id or not span_id:
            return None
        return cls(trace_id, span_id, bool(int(match[3], 16) & 1))


@functools.lru_cache(maxsize=4096)
def parse_traceparent(text: str) -> TraceParent | None:
    """:meth:`TraceParent.parse`, remembered: a trajectory's traceparent is parsed for each
    of its spans, on the caller's thread and again when exported (a regex each time)."""
    return TraceParent.parse(text)


def new_traceparent(sampled: bool) -> str:
    """A fresh trace and root span id (a trajectory's, made at admission)."""
    return TraceParent(secrets.randbits(128) or 1, secrets.randbits(64) or 1, sampled).format()


# The share traced where a job leaves it automatic, when the process was told one
# (OTEL_TRACES_SAMPLER, read by libra.telemetry); None: the per-step budget.
_process_ratio: float | None = None


def set_process_sample_ratio(ratio: float | None) -> None:
    """Trace this share of the trajectories of jobs whose ``trace_sample_ratio`` is
    automatic (None: the per-step budget); once, at start."""
    global _process_ratio
    _process_ratio = ratio


def effective_sample_ratio(configured: float, trajectories_per_step: int) -> float:
    """The share of trajectories traced: ``configured`` when >= 0, else the process's
    ratio if it was given one, else every trajectory of a small job and about
    ``FULL_TRACE_MAX_TRAJECTORIES_PER_STEP`` per step of a large one."""
    if configured >= 0:
        return min(configured, 1.0)
    if _process_ratio is not None:
        return _process_ratio
    return min(1.0, FULL_TRACE_MAX_TRAJECTORIES_PER_STEP / max(trajectories_per_step, 1))


def is_sampled(key: str, ratio: float) -> bool:
    """Whether the trajectory ``key`` is traced at ``ratio``: a hash of the key, so a
    re-admission after a restart decides the same."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < ratio * (1 << 64)


class SpanRecord(NamedTuple):
    """One finished span. ``parent`` is a traceparent ("" starts a new trace); ``links``
    are traceparents of related spans in other traces (a trajectory's training step).
    A named tuple, not a frozen dataclass: one is made on the service's thread for every
    span, and a tuple is built in a third of the time (~1.6 against ~4.6 us)."""

    name: str
    parent: str
    start_ms: int
    end_ms: int
    attributes: Mapping[str, AttributeValue] = MappingProxyType({})
    links: Sequence[str] = ()
    error: str = ""


class SpanSink(Protocol):
    """Where finished spans go (the OpenTelemetry adapter, or nothing)."""

    def record(self, span: SpanRecord) -> str:
        """Record ``span``; its own traceparent ("" when it was not recorded)."""
        ...

    def record_root(self, traceparent: str, span: SpanRecord) -> None:
        """Record ``span`` as the span ``traceparent`` names (a trajectory's root)."""
        ...


_sink: SpanSink | None = None


def set_sink(sink: SpanSink | None) -> None:
    """Install where this process's trajectory spans go (None: nowhere); once, at start."""
    global _sink
    _sink = sink


def is_recording(traceparent: str) -> bool:
    """Spans under ``traceparent`` would be recorded: an exporter is installed and the
    trajectory was sampled at admission."""
    if _sink is None or not traceparent:
        return False
    parent = parse_traceparent(traceparent)
    return parent is not None and parent.sampled


def record_child(name: str, traceparent: str, start_ms: int, end_ms: int, *,
                 error: str = "", links: Sequence[str] = (),
                 **attributes: AttributeValue) -> str:
    """Record a finished span under the trajectory's root; its traceparent ("" when the
    trajectory is not traced or nothing exports)."""
    if _sink is None or not is_recording(traceparent):
        return ""
    return _sink.record(SpanRecord(name, traceparent, start_ms, end_ms, attributes,
                                   tuple(links), error))


def record_span(name: str, start_ms: int, end_ms: int, *, links: Sequence[str] = (),
                **attributes: AttributeValue) -> str:
    """Record a span that starts a trace of its own (a training step, an elastic move);
    its traceparent, "" when nothing exports."""
    if _sink is None:
        return ""
    return _sink.record(SpanRecord(name, "", start_ms, end_ms, attributes, tuple(links)))


def end_trajectory(traceparent: str, start_ms: int, end_ms: int, outcome: str, *,
                   error: str = "", links: Sequence[str] = (),
                   **attributes: AttributeValue) -> None:
    """Emit the trajectory's root span, from admission (``start_ms``) to its end:
    ``outcome`` is "trained" or "dropped_<reason>"."""
    if _sink is None or not is_recording(traceparent):
        return
    _sink.record_root(traceparent, SpanRecord(
        "trajectory", "", start_ms, end_ms, {"libra.outcome": outcome, **attributes},
        tuple(links), error))


def record_event(name: str, at_ms: int, fields: Mapping[str, Any]) -> str:
    """A point event (an elastic join or release, a planner decision) as a span of its own
    trace, its fields as ``libra.<key>`` attributes (nested values as JSON text)."""
    if _sink is None:
        return ""
    attributes: dict[str, AttributeValue] = {}
    for key, value in fields.items():
        if isinstance(value, str | int | float | bool):
            attributes[f"libra.{key}"] = value
        elif value is not None:
            attributes[f"libra.{key}"] = json.dumps(value, sort_keys=True, default=str)
    return _sink.record(SpanRecord(name, "", at_ms, at_ms, attributes))
