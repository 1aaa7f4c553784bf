"""One resolver for every extension point: dotted paths and Python entry points.

Reward functions, tools and policies are named in config as ``"package.module:Name"``
(or ``"package.module.Name"``) and resolved here, so every plugin error reads the same
way: which part of the path is wrong and what was expected. Installed distributions
register plugins as entry points in the groups ``libra.tools``, ``libra.rewards`` and
``libra.agents`` (docs/plugins.md); every registry loads them through
:func:`load_entry_points`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any


class PluginError(ValueError):
    """A dotted path does not resolve to a usable object (bad config, not a bug)."""


def _split_path(path: str) -> tuple[str, str]:
    if not isinstance(path, str) or not path.strip():
        raise PluginError(f"plugin path must be a non-empty string, got {path!r}")
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise PluginError(f"plugin path {path!r} must look like 'package.module:Name'")
    return module_name, attr_path


def _check_type(path: str, obj: Any, expected: type) -> None:
    is_ok = issubclass(obj, expected) if isinstance(obj, type) else isinstance(obj, expected)
    if not is_ok:
        raise PluginError(
            f"plugin {path!r} resolved to {obj!r}, which is not a {expected.__qualname__}"
        )


def load_object(path: str, expected: type | None = None) -> Any:
    """Import the object a dotted path names.

    Args:
        path: ``"package.module:Attr.sub"`` or ``"package.module.Attr"``.
        expected: If given, the object must be an instance of it or, for a class, a
            subclass of it.

    Returns:
        The resolved object (a class is returned as is, not instantiated).

    Raises:
        PluginError: The module cannot be imported, an attribute is missing, or the
            object has the wrong type. The message names the failing part.
    """
    module_name, attr_path = _split_path(path)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise PluginError(f"plugin {path!r}: cannot import module {module_name!r} ({exc})") from exc
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            raise PluginError(
                f"plugin {path!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if expected is not None:
        _check_type(path, obj, expected)
    return obj


# Entry-point groups, one per kind of plugin (pyproject: [project.entry-points."libra.tools"]).
TOOLS_GROUP = "libra.tools"
REWARDS_GROUP = "libra.rewards"
AGENTS_GROUP = "libra.agents"


def entry_point_names(group: str) -> list[str]:
    """Names registered under ``group`` by installed distributions, from their metadata
    only (nothing is imported): what a process that must not load the plugin (the
    coordinator) can check a spec against."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})


def _load(ep: importlib.metadata.EntryPoint, group: str) -> Any:
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - any import-time fault of a plugin
        raise PluginError(f"entry point {ep.name!r} = {ep.value!r} (group {group}) "
                          f"failed to load: {type(exc).__name__}: {exc}") from exc


def load_entry_point(group: str, name: str) -> Any | None:
    """Import the entry point ``name`` of ``group`` only; None when none is installed.

    Raises:
        PluginError: It is installed but fails to import (named, with the error).
    """
    for ep in importlib.metadata.entry_points(group=group, name=name):
        return _load(ep, group)
    return None


def load_entry_points(group: str) -> list[tuple[str, Any]]:
    """Import every entry point of ``group``: ``[(name, object), ...]`` sorted by name.

    A broken plugin fails the whole load instead of being skipped: a job that names it
    would otherwise be refused at submit as "unknown", hiding the real error.

    Raises:
        PluginError: An entry point cannot be imported (or raises while importing); the
            message names the group, the entry point, its target and the error.
    """
    eps = sorted(importlib.metadata.entry_points(group=group), key=lambda ep: ep.name)
    return [(ep.name, _load(ep, group)) for ep in eps]
