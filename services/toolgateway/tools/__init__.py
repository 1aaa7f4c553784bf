"""Tool plugins: the contract (``base``), the registry, and the built-in tools."""

from __future__ import annotations

from collections.abc import Iterable

from services.toolgateway.sandbox import Sandbox
from services.toolgateway.tools.base import Tool, ToolContext, ToolOutput
from services.toolgateway.tools.calculator import CalculatorConfig, CalculatorTool
from services.toolgateway.tools.python_exec import PythonTool
from services.toolgateway.tools.registry import ToolRegistry, entry_point_tools, load_tool
from services.toolgateway.tools.search import SearchConfig, SearchTool


def builtin_tools(sandbox: Sandbox, calculator: CalculatorConfig | None = None,
                  search: SearchConfig | None = None,
                  python_timeout_s: float = 10.0) -> list[Tool]:
    """The built-in tools: calculator, python (in ``sandbox``) and search."""
    return [CalculatorTool(calculator), PythonTool(sandbox, timeout_s=python_timeout_s),
            SearchTool(search)]


def build_tool_registry(builtins: Iterable[Tool], extra_paths: Iterable[str] = ()
                        ) -> ToolRegistry:
    """The gateway's tools: built-ins, then ``libra.tools`` entry points, then the
    config's dotted paths.

    Raises:
        PluginError: A plugin fails to import or breaks the contract (named).
        ValueError: Two tools share a name.
    """
    registry = ToolRegistry(builtins)
    for tool in entry_point_tools():
        registry.register(tool)
    for path in extra_paths:
        registry.register(load_tool(path))
    return registry


__all__ = ["CalculatorConfig", "CalculatorTool", "PythonTool", "SearchConfig", "SearchTool",
           "Tool", "ToolContext", "ToolOutput", "ToolRegistry", "build_tool_registry",
           "builtin_tools", "load_tool"]
