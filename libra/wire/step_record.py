"""The one codec of :class:`~libra.types.StepRecord`: the ``step_json`` a trainer sends
(gRPC ``ReportStep``), the coordinator stores (Redis) and report.json lists.

Pure (no protobuf import), so cores may use it. The JSON is a flat object: the named
fields (left out when None) and the backend's metrics beside them, the shape stored runs
already hold. Decoding is strict where it can be: named fields have their types, and a
key that is not a named field must be a number (a backend metric) - anything else is
refused naming the key, as is a missing ``step``.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from libra.errors import InvalidArgument
from libra.limits import MAX_NUM_STEPS, MAX_STEP_JSON_BYTES, check_encodable
from libra.types import StepRecord

FIELD = "step_json"
_NAMED = tuple(f.name for f in fields(StepRecord) if f.name != "metrics")
_NAMED_SET = frozenset(_NAMED)
_INTS = frozenset({"step", "policy_version", "num_trajectories", "num_sequences",
                   "dropped_stale", "dropped_failed", "hybrid_workers", "hybrid_joining",
                   "migrations", "weights_pruned"})
_MAPS = {"reward_components": "a number", "bucket_occupancy": "an integer"}
_MAX_VERSION = 1 << 62


def step_record_to_dict(record: StepRecord) -> dict[str, Any]:
    """The JSON-able object: named fields that are set, then the metrics."""
    out = {name: getattr(record, name) for name in _NAMED
           if getattr(record, name) is not None}
    out.update(record.metrics)
    return out


def step_record_to_json(record: StepRecord) -> str:
    """Encode a step record as ``step_json`` (None fields left out)."""
    return json.dumps(step_record_to_dict(record))


def step_record_from_json(text: str) -> StepRecord:
    """Decode ``step_json``; InvalidArgument naming the field on anything malformed."""
    if len(text) > MAX_STEP_JSON_BYTES:
        raise InvalidArgument(FIELD, f"{len(text)} characters, at most {MAX_STEP_JSON_BYTES}")
    try:
        data = json.loads(text)
    except ValueError as exc:  # JSONDecodeError and a lone surrogate's UnicodeError
        raise InvalidArgument(FIELD, f"not valid JSON: {exc}") from exc
    return step_record_from_dict(data)


def step_record_from_dict(data: Any, *, is_checked: bool = False) -> StepRecord:
    """The record of a decoded JSON object (a checkpoint's copy, a stored step).

    ``is_checked``: the object was checked by this codec before it was stored (the
    coordinator checks every reported step), so only its keys are sorted into fields:
    the live view decodes a job's whole history on every poll, and the full check costs
    ~0.15 ms a step (a 1,000-step job: 150 ms, over the view's 100 ms budget).
    """
    if is_checked:
        return StepRecord(**{k: v for k, v in data.items() if k in _NAMED_SET},
                          metrics={k: v for k, v in data.items() if k not in _NAMED_SET})
    if not isinstance(data, dict):
        raise InvalidArgument(FIELD, "must be a JSON object")
    check_encodable(data, FIELD)
    if "step" not in data:
        raise InvalidArgument(f"{FIELD}.step", "missing (every step record has one)")
    named: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    for key, value in data.items():
        if key in _NAMED:
            named[key] = _checked(key, value)
        elif key == "metrics" or not _is_number(value):
            raise InvalidArgument(f"{FIELD}.{key}", "unknown field (not a named field, and "
                                  f"a backend metric is a number), got {str(value)[:40]!r}")
        else:
            metrics[key] = value
    return StepRecord(**named, metrics=metrics)


def _checked(key: str, value: Any) -> Any:
    name = f"{FIELD}.{key}"
    if value is None:
        raise InvalidArgument(name, "must not be null (leave the field out instead)")
    if key in _MAPS:
        if not isinstance(value, dict) or not all(
                _is_number(v) and (key != "bucket_occupancy" or isinstance(v, int))
                for v in value.values()):
            raise InvalidArgument(name, f"must be an object of name -> {_MAPS[key]}")
        return dict(value)
    if key in _INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(name, f"must be an integer, got {str(value)[:40]!r}")
        if key == "step" and not 0 <= value <= MAX_NUM_STEPS:
            raise InvalidArgument(name, f"must be in [0, {MAX_NUM_STEPS}], got {value}")
        if key == "policy_version" and not -1 <= value < _MAX_VERSION:
            raise InvalidArgument(name, f"must be an integer >= -1, got {value}")
        return value
    if not _is_number(value):
        raise InvalidArgument(name, f"must be a number, got {str(value)[:40]!r}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
