"""Plugin contract: valid and invalid dotted paths for tools and rewards."""

from __future__ import annotations

import pytest

from libra.plugins import PluginError, load_object
from services.toolgateway.rewards import load_reward
from services.toolgateway.tools import CalculatorTool, load_tool


class NotATool:
    name = "x"


def test_valid_paths_resolve():
    assert load_object("services.toolgateway.tools.calculator:CalculatorTool") is CalculatorTool
    assert load_object("services.toolgateway.tools.calculator.CalculatorTool") is CalculatorTool
    assert load_tool("services.toolgateway.tools.calculator:CalculatorTool").name == "calculator"
    assert load_reward("services.toolgateway.rewards.simple:NumericReward").name == "numeric"


@pytest.mark.parametrize("path, message", [
    ("no_such_pkg.mod:X", "cannot import module 'no_such_pkg.mod'"),
    ("services.toolgateway.tools.calculator:Missing", "has no attribute 'Missing'"),
    ("justaname", "must look like"),
    ("", "non-empty"),
])
def test_invalid_paths_name_the_problem(path, message):
    with pytest.raises(PluginError, match=message):
        load_object(path)


def test_wrong_type_is_rejected():
    with pytest.raises(PluginError, match="not a int"):
        load_object("services.toolgateway.tools.calculator:CalculatorTool", expected=int)
    with pytest.raises(PluginError, match="lacks attribute"):
        load_tool(f"{__name__}:NotATool")
    with pytest.raises(PluginError, match="async def score"):
        load_reward("services.toolgateway.tools.calculator:CalculatorTool")
