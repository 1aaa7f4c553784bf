"""Tool registry: the name -> tool map the core dispatches on, plus args validation.

User tools come in as entry points (group ``libra.tools``) or dotted paths
(``"pkg.mod:MyTool"``), both resolved by ``libra.plugins``; a class is instantiated
without arguments.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import jsonschema

from libra.errors import InvalidArgument
from libra.plugins import TOOLS_GROUP, PluginError, load_entry_points, load_object
from services.toolgateway.errors import UnknownTool
from services.toolgateway.tools.base import Tool

_REQUIRED_ATTRS = ("name", "description", "args_schema", "idempotent", "timeout_s")


def check_tool(obj: Any, origin: str) -> Tool:
    """Check that ``obj`` honours the ``Tool`` contract.

    Raises:
        PluginError: An attribute is missing or ``run`` is not a coroutine function.
    """
    missing = [a for a in _REQUIRED_ATTRS if not hasattr(obj, a)]
    if missing:
        raise PluginError(f"tool {origin!r} lacks attribute(s) {', '.join(missing)}")
    if not inspect.iscoroutinefunction(getattr(obj, "run", None)):
        raise PluginError(f"tool {origin!r} must define 'async def run(self, args, ctx)'")
    jsonschema.Draft202012Validator.check_schema(obj.args_schema)
    return obj


def make_tool(obj: Any, origin: str) -> Tool:
    """A tool from a plugin object: a class is instantiated with no arguments."""
    if inspect.isclass(obj):
        obj = obj()
    return check_tool(obj, origin)


def load_tool(path: str) -> Tool:
    """Resolve a dotted path to a tool (instantiating a class with no arguments)."""
    return make_tool(load_object(path), path)


def entry_point_tools() -> list[Tool]:
    """The tools installed distributions register in the ``libra.tools`` group.

    Raises:
        PluginError: An entry point fails to import or is not a tool (named).
    """
    return [make_tool(obj, f"entry point {name!r}")
            for name, obj in load_entry_points(TOOLS_GROUP)]


def _field_name(error: jsonschema.ValidationError) -> str:
    if error.validator == "required":
        # The missing property is named in the message, not in the path.
        return str(error.message.split("'")[1]) if "'" in error.message else "args"
    path = ".".join(str(p) for p in error.absolute_path)
    return f"args.{path}" if path else "args"


class ToolRegistry:
    """Holds the tools by name and validates call arguments against their schemas."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        """Add a tool; names must be unique."""
        check_tool(tool, getattr(tool, "name", repr(tool)))
        if tool.name in self._tools:
            raise ValueError(f"tool name {tool.name!r} registered twice")
        self._tools[tool.name] = tool
        self._validators[tool.name] = jsonschema.Draft202012Validator(tool.args_schema)

    def get(self, name: str) -> Tool:
        """Return the tool or raise ``UnknownTool`` listing the known names."""
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(name, self._tools) from None

    def validate_args(self, name: str, args: dict[str, Any]) -> None:
        """Raise ``InvalidArgument`` naming the first offending field."""
        error = jsonschema.exceptions.best_match(self._validators[name].iter_errors(args))
        if error is not None:
            field = _field_name(error)
            raise InvalidArgument(field, f"{error.message} (tool {name!r})")

    def __iter__(self):
        return iter(self._tools.values())

    def names(self) -> list[str]:
        """Registered tool names, sorted."""
        return sorted(self._tools)
