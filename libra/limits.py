"""Input limits shared by the spec parser and the services' cores.

Every string and number a client sends is bounded where it enters: a name or id that is
too long, holds a control character (a newline forges a log line) or a lone surrogate
(Redis and JSON encoders raise on it) is refused with ``InvalidArgument`` naming the
field, before anything is written. The figures are documented in docs/operations.md.
"""

from __future__ import annotations

import math
from typing import Any

from libra.errors import InvalidArgument

# Job names, bucket / tool / reward names and ids (jobs, workers, instances, trajectories).
MAX_NAME_CHARS = 128
MAX_ID_CHARS = 256
# A spec document (TOML/JSON/YAML text); the shipped examples are under 4 KiB.
MAX_SPEC_BYTES = 1 << 20
# Longest a job can run, in steps (the demo runs 600).
MAX_NUM_STEPS = 1_000_000
# A step record is a few hundred bytes of metrics; GetJob returns the whole history.
MAX_STEP_JSON_BYTES = 64 * 1024
# Generations are wall-clock ms (services/coordinator/elastic.py); one this far ahead of
# the receiver's clock is not from a coordinator (clock skew between hosts is far less).
MAX_GENERATION_AHEAD_MS = 24 * 3600 * 1000
# Leases one RenewLeases call renews: one Redis script runs over the batch, and Redis
# serves nothing else meanwhile (about 2 ms for 1,000); clients split larger sets.
MAX_LEASES_PER_RENEWAL = 1000


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def check_name(value: str, field: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """A human-given name: 1..max_chars printable characters (spaces allowed)."""
    if not value.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(value) > max_chars:
        raise InvalidArgument(field, f"{len(value)} characters, at most {max_chars}")
    if not value.isprintable() or _has_surrogate(value):
        raise InvalidArgument(field, "only printable characters (no control characters, "
                              "newlines or lone surrogates)")
    return value


def check_id(value: str, field: str, max_chars: int = MAX_ID_CHARS) -> str:
    """An identifier: 1..max_chars printable characters without whitespace."""
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > max_chars:
        raise InvalidArgument(field, f"{len(value)} characters, at most {max_chars}")
    if not value.isprintable() or _has_surrogate(value) or any(c.isspace() for c in value):
        raise InvalidArgument(field, "only printable characters without spaces")
    return value


def check_encodable(data: Any, field: str) -> None:
    """Every key and string of parsed JSON/YAML is valid Unicode (a ``"\\ud800"`` escape
    parses to a lone surrogate). Each object is visited once, so YAML aliases cannot make
    the walk exponential."""
    seen: set[int] = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                raise InvalidArgument(field, "a string holds a lone surrogate (not valid "
                                      "Unicode)")
        elif isinstance(item, dict | list) and id(item) not in seen:
            seen.add(id(item))
            stack.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)


def check_step_record(record: dict[str, Any]) -> int:
    """The record's step, checked: an integer in [0, MAX_NUM_STEPS], and a
    ``policy_version`` (when given) an integer >= -1."""
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_NUM_STEPS:
        raise InvalidArgument("step_json", f"needs an integer 'step' in [0, {MAX_NUM_STEPS}], "
                              f"got {str(step)[:40]!r}")
    version = record.get("policy_version", -1)
    if isinstance(version, bool) or not isinstance(version, int) or not -1 <= version < 1 << 62:
        raise InvalidArgument("step_json", f"'policy_version' must be an integer >= -1, got "
                              f"{str(version)[:40]!r}")
    return step


def check_generation(generation: int, now_ms: int) -> int:
    """A lend/reclaim generation: >= 0 and not far ahead of the clock (they are
    wall-clock ms), so one forged value cannot lock an instance out of later lends."""
    if generation < 0 or generation > now_ms + MAX_GENERATION_AHEAD_MS:
        raise InvalidArgument("generation", f"{generation} is not a generation (wall-clock "
                              f"ms, at most {MAX_GENERATION_AHEAD_MS} ms ahead of {now_ms})")
    return generation


def check_finite(value: float, field: str, low: float, high: float) -> float:
    """A finite number in [low, high]."""
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidArgument(field, f"must be a finite number in [{low:g}, {high:g}], "
                              f"got {value!r}")
    return value
