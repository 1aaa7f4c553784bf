"""A spec document in, typed dataclasses out: the format-neutral half of the job spec.

:func:`parse_document` reads TOML, JSON or YAML into a mapping (bounded in size and
nesting, ``libra.spec_limits``); :func:`build_dataclass` turns the mapping into the spec's
dataclasses, refusing an unknown key, a missing field or a wrong type with
``InvalidArgument`` naming the dotted field. Which values are in range is
``libra.jobspec``'s business; this module knows no field by name, so adding a spec field
never touches it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from typing import Any

import yaml

from libra.errors import InvalidArgument
from libra.spec_limits import COUNTS, MAX_SPEC_INT, check_document_text, check_document_values


def parse_document(text: str, fmt: str) -> dict[str, Any]:
    """Parse a spec document; ``fmt`` is toml, json or yaml."""
    fmt = (fmt or "toml").lower()
    check_document_text(text)
    try:
        if fmt == "toml":
            data = tomllib.loads(text)
        elif fmt == "json":
            data = json.loads(text)
        elif fmt in ("yaml", "yml"):
            data = yaml.safe_load(text)
        else:
            raise InvalidArgument("spec_format", f"unknown format {fmt!r} (toml, json, yaml)")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidArgument("spec", f"not valid {fmt}: {exc}") from exc
    except RecursionError as exc:  # "[[[[...": nesting deeper than any spec needs
        raise InvalidArgument("spec", f"not valid {fmt}: nested too deeply") from exc
    if not isinstance(data, dict):
        raise InvalidArgument("spec", "the document must be a mapping")
    check_document_values(data)
    return data


def _convert(path: str, ftype: Any, value: Any) -> Any:
    """``value`` checked against the annotation ``ftype`` (dataclass, list or scalar)."""
    origin = typing.get_origin(ftype)
    if dataclasses.is_dataclass(ftype):
        if not isinstance(value, dict):
            raise InvalidArgument(path, "must be a table/object")
        return build_dataclass(ftype, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise InvalidArgument(path, "must be a list")
        if len(value) > COUNTS.get(path, len(value)):  # before building thousands of items
            raise InvalidArgument(path, f"{len(value)} entries, at most {COUNTS[path]}")
        (item,) = typing.get_args(ftype)
        return [_convert(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    if ftype is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) <= MAX_SPEC_INT else math.inf
    if not isinstance(value, ftype) or (ftype is int and isinstance(value, bool)):
        raise InvalidArgument(path, f"must be {ftype.__name__}, got {type(value).__name__}")
    # Every number finite and JSON-safe; the per-field maxima: libra/spec_limits.py.
    if ftype is float and not math.isfinite(value):
        raise InvalidArgument(path, f"must be a finite number, got {value!r}")
    if ftype is int and abs(value) > MAX_SPEC_INT:
        raise InvalidArgument(path, f"must be an integer of magnitude at most {MAX_SPEC_INT}")
    return value


def build_dataclass(cls: type, data: dict[str, Any], prefix: str) -> Any:
    """``cls`` built from ``data`` field by field, nested tables into nested dataclasses.

    Raises:
        InvalidArgument: An unknown key (listing the known ones), a required field left
            out, or a value of the wrong type, not finite or too large; the field is
            named by its dotted path under ``prefix``.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            raise InvalidArgument(where, f"unknown field (known: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        if f.name in data:
            kwargs[f.name] = _convert(path, hints[f.name], data[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InvalidArgument(path, "required")
    return cls(**kwargs)
