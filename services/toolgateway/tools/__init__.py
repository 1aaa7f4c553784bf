"""Tool plugins: the contract (``base``), the registry, and the built-in tools."""

from __future__ import annotations

from services.toolgateway.sandbox import Sandbox
from services.toolgateway.tools.base import Tool, ToolContext, ToolOutput
from services.toolgateway.tools.calculator import CalculatorConfig, CalculatorTool
from services.toolgateway.tools.python_exec import PythonTool
from services.toolgateway.tools.registry import ToolRegistry, load_tool
from services.toolgateway.tools.search import SearchConfig, SearchTool


def builtin_tools(sandbox: Sandbox, calculator: CalculatorConfig | None = None,
                  search: SearchConfig | None = None,
                  python_timeout_s: float = 10.0) -> list[Tool]:
    """The built-in tools: calculator, python (in ``sandbox``) and search."""
    return [CalculatorTool(calculator), PythonTool(sandbox, timeout_s=python_timeout_s),
            SearchTool(search)]


__all__ = ["CalculatorConfig", "CalculatorTool", "PythonTool", "SearchConfig", "SearchTool",
           "Tool", "ToolContext", "ToolOutput", "ToolRegistry", "builtin_tools", "load_tool"]
