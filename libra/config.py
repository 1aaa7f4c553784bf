"""The one config loader: CLI > environment > config file > defaults.

Every service declares a frozen dataclass (nested dataclasses for groups). This module is
the only place in the project that reads ``os.environ`` for configuration. Keys:

* file (TOML): ``[telemetry] otlp_endpoint = "..."`` or top-level ``port = 50051``;
* environment: ``LIBRA_<SERVICE>_<FIELD>``, groups joined by ``__``
  (``LIBRA_ROLLOUT_TELEMETRY__OTLP_ENDPOINT``); ``LIBRA_<FIELD>`` applies to every service;
* CLI: ``--port 50051``, ``--telemetry.otlp-endpoint URL``.

Help text comes from ``field(metadata={"help": ...})`` so ``--help`` documents each knob.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ENV_PREFIX = "LIBRA_"


def knob(default: Any = dataclasses.MISSING, help: str = "", **kwargs: Any) -> Any:
    """A config field with help text (shown by ``--help``)."""
    if isinstance(default, (list, dict)):
        value = default
        return dataclasses.field(default_factory=lambda: type(value)(value),
                                 metadata={"help": help}, **kwargs)
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, Any, str]]:
    """Flatten nested dataclasses into (dotted name, type, help)."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, Any, str]] = []
    for f in dataclasses.fields(cls):
        ftype = hints[f.name]
        if dataclasses.is_dataclass(ftype):
            out.extend(_leaf_fields(ftype, f"{prefix}{f.name}."))
        else:
            out.append((f"{prefix}{f.name}", ftype, f.metadata.get("help", "")))
    return out


def _base_type(ftype: Any) -> Any:
    # Optional[X] -> X; keep list[...] as is.
    if isinstance(ftype, types.UnionType) or typing.get_origin(ftype) is typing.Union:
        args = [a for a in typing.get_args(ftype) if a is not type(None)]
        return args[0]
    return ftype


def _coerce(name: str, ftype: Any, raw: Any) -> Any:
    base = _base_type(ftype)
    if raw is None:
        return None
    if typing.get_origin(base) is list:
        if isinstance(raw, str):
            raw = [item.strip() for item in raw.split(",") if item.strip()]
        if not isinstance(raw, list):
            raise ValueError(f"config {name}: expected a list, got {raw!r}")
        (item_type,) = typing.get_args(base) or (str,)
        return [_coerce(name, item_type, item) for item in raw]
    if base is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"config {name}: expected a boolean, got {raw!r}")
    if base in (int, float) and isinstance(raw, bool):
        raise ValueError(f"config {name}: expected {base.__name__}, got a boolean")
    if base is int and isinstance(raw, float) and not raw.is_integer():
        # int(1.5) would silently truncate a file value.
        raise ValueError(f"config {name}: expected an integer, got {raw!r}")
    try:
        return base(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config {name}: cannot read {raw!r} as {base.__name__}") from exc


SERVICE_SECTIONS = ("coordinator", "scheduler", "rollout", "trainer", "toolgateway")


def _from_file(path: Path, section: str | None) -> dict[str, Any]:
    """Flatten a TOML file. A shared file may hold ``[scheduler]``, ``[rollout]``, ...
    tables: the service's own table overrides the common top-level keys and groups, and
    the other services' tables are ignored."""
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    own = data.get(section, {}) if section else {}
    data = {k: v for k, v in data.items() if k not in SERVICE_SECTIONS}
    for key, value in own.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    flat: dict[str, Any] = {}

    def walk(obj: Mapping[str, Any], prefix: str) -> None:
        for key, value in obj.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value

    walk(data, "")
    return flat


def _from_env(service: str, names: list[str], environ: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in names:
        suffix = name.replace(".", "__").upper()
        for key in (f"{ENV_PREFIX}{suffix}", f"{ENV_PREFIX}{service.upper()}_{suffix}"):
            if key in environ:  # the service-specific key wins: it is read last
                found[name] = environ[key]
    return found


def _build(cls: type[T], values: Mapping[str, Any], prefix: str = "",
           base: Any = None) -> T:
    # ``base`` is the parent's default for this group (e.g. ServerConfig(port=50051)), so
    # a service's own group defaults survive; building from the class would lose them.
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            if base is not None:
                group_default = getattr(base, f.name)
            elif f.default_factory is not dataclasses.MISSING:
                group_default = f.default_factory()
            elif f.default is not dataclasses.MISSING:
                group_default = f.default
            else:
                group_default = None
            kwargs[f.name] = _build(hints[f.name], values, f"{name}.", group_default)
        elif name in values:
            kwargs[f.name] = _coerce(name, hints[f.name], values[name])
    if base is not None:
        return dataclasses.replace(base, **kwargs)
    return cls(**kwargs)


def build_parser(cls: type, service: str, description: str = "") -> argparse.ArgumentParser:
    """An argparse parser with one ``--dotted.name`` option per leaf field."""
    parser = argparse.ArgumentParser(
        prog=f"python -m services.{service}", description=description,
        epilog=f"Environment: {ENV_PREFIX}{service.upper()}_<FIELD> (groups joined by __).",
    )
    parser.add_argument("--config", type=Path, help="TOML config file")
    for name, _ftype, help_text in _leaf_fields(cls):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None,
                            help=help_text)
    return parser


def load_config(cls: type[T], service: str, argv: Sequence[str] | None = None,
                environ: Mapping[str, str] | None = None, description: str = "") -> T:
    """Resolve ``cls`` from defaults, the config file, the environment and the CLI."""
    args = build_parser(cls, service, description).parse_args(argv)
    environ = os.environ if environ is None else environ
    names = [name for name, _, _ in _leaf_fields(cls)]
    values: dict[str, Any] = {}
    config_path = args.config or environ.get(f"{ENV_PREFIX}{service.upper()}_CONFIG")
    if config_path:
        values.update(_from_file(Path(config_path), service))
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"config file {config_path}: unknown keys {unknown}")
    values.update(_from_env(service, names, environ))
    values.update({n: v for n, v in vars(args).items() if n in names and v is not None})
    return _build(cls, values)


def option_names(cls: type) -> list[str]:
    """Every dotted option name of a config class (frozen by a snapshot test)."""
    return [name for name, _, _ in _leaf_fields(cls)]


def redact(cfg: Any) -> dict[str, Any]:
    """The config as a dict for the startup log, with secrets masked."""
    out = dataclasses.asdict(cfg)

    def mask(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: ("***" if any(s in k for s in ("password", "token", "secret", "key"))
                        and obj[k] else mask(v)) for k, v in obj.items()}
        if isinstance(obj, str):
            return mask_url_password(obj)
        return obj

    return mask(out)


_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:@/\s]*):[^@/\s]+@",
                           re.IGNORECASE)


def mask_url_password(text: str) -> str:
    """``redis://:secret@host`` -> ``redis://:***@host`` (any scheme, any user name): a
    Redis password travels in its URL, which services log with their configuration."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def env_flag(name: str, default: str = "") -> str:
    """Read one process-level setting (e.g. ``REDIS_URL``) - the only other env read."""
    return os.environ.get(name, default)
