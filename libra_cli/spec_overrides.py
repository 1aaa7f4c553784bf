"""``--set section.key=value`` overrides of a job spec document (pure).

`libra run` and `libra submit` apply them to the parsed document before validation, so
an override is checked exactly like the same key in the file.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

from libra.errors import InvalidArgument

_OVERRIDE_STEP = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of the spec document with ``section.key=value`` overrides applied.

    ``value`` is read as a TOML value (``8``, ``1e-5``, ``true``, ``"text"``,
    ``["calculator"]``) and, when it is not one, as a bare string. A list item is
    addressed by index (``layout.buckets[1].max_batch_size=4``). The result still goes
    through `libra.jobspec.job_spec_from_dict`, so an unknown key or a wrong type is refused with
    the field's name, exactly as in the file.
    """
    result = json.loads(json.dumps(data))
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        steps = [_OVERRIDE_STEP.fullmatch(part) for part in key.split(".")]
        if not sep or not key or not all(steps):
            raise InvalidArgument("--set", f"{item!r} is not SECTION.KEY=VALUE")
        _set_path(result, key, [(m.group(1), m.group(2)) for m in steps if m],
                  _override_value(raw.strip()))
    return result


def _override_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _set_path(doc: dict[str, Any], key: str, steps: list[tuple[str, str | None]],
              value: Any) -> None:
    node: Any = doc
    for depth, (name, index) in enumerate(steps):
        last = depth == len(steps) - 1
        if index is None:
            if last:
                node[name] = value
                return
            node = node.setdefault(name, {})
        else:
            items = node.get(name)
            if not isinstance(items, list) or int(index) >= len(items):
                raise InvalidArgument(key, f"{name}[{index}] is not in the spec (it has "
                                      f"{len(items) if isinstance(items, list) else 0} items)")
            if last:
                items[int(index)] = value
                return
            node = items[int(index)]
        if not isinstance(node, dict):
            raise InvalidArgument(key, f"{name} is not a table")
