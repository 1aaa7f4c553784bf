"""Plugins as Python entry points (``libra.tools``, ``libra.rewards``): the gateway
registers built-ins + entry points + dotted paths; a plugin that raises at import stops
the gateway, naming the entry point and the error.

Real: a distribution on ``sys.path`` with an ``entry_points.txt`` (read by
``importlib.metadata``), ``build_core`` with its real sandbox, tools and rewards.
"""

from __future__ import annotations

import logging
import sys

import pytest

from libra.plugins import (
    REWARDS_GROUP,
    TOOLS_GROUP,
    PluginError,
    entry_point_names,
    load_entry_points,
)
from services.toolgateway import __main__ as entry
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ScoreRequest, ToolCall
from tests.fixtures.plugin_dist import install_plugin_dist

PLUGIN = """
from services.toolgateway.rewards.base import RewardOutput
from services.toolgateway.tools.base import ToolOutput


class Shout:
    name = "shout"
    description = "Upper-case the text."
    args_schema = {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}
    idempotent = True
    timeout_s = 1.0

    async def run(self, args, ctx):
        return ToolOutput(ok=True, output=args["text"].upper())


class Length:
    name = "answer_length"
    description = "1.0 for a short answer."

    async def score(self, request):
        short = len(request.final_text) <= 3
        return RewardOutput(reward=1.0 if short else 0.0,
                            components={"short": 1.0 if short else 0.0})
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    install_plugin_dist(tmp_path, monkeypatch, "libra_demo_plugin", PLUGIN, {
        TOOLS_GROUP: {"shout": "libra_demo_plugin:Shout"},
        REWARDS_GROUP: {"answer_length": "libra_demo_plugin:Length"}})
    yield
    sys.modules.pop("libra_demo_plugin", None)


def test_entry_point_names_come_from_metadata_only(plugin):
    assert "shout" in entry_point_names(TOOLS_GROUP)
    assert "libra_demo_plugin" not in sys.modules  # listed, not imported
    assert [name for name, _ in load_entry_points(REWARDS_GROUP)] == ["answer_length"]


async def test_the_gateway_registers_entry_point_tools_and_rewards(plugin):
    core = entry.build_core(ToolGatewayConfig(calculator_transient_failure_rate=0.0))
    assert [s.name for s in core.list_tools()] == ["calculator", "python", "search", "shout"]
    assert "answer_length" in [r.name for r in core.list_rewards()]
    result = await core.execute(ToolCall("t", "c1", "shout", {"text": "hi"}))
    assert result.output == "HI"
    scored = await core.score(ScoreRequest("t", "answer_length", "42"))
    assert (scored.reward, scored.components) == (1.0, {"short": 1.0})


def test_a_plugin_raising_at_import_stops_the_gateway_naming_it(tmp_path, monkeypatch,
                                                               caplog):
    install_plugin_dist(tmp_path, monkeypatch, "libra_broken_plugin",
                        "raise RuntimeError('missing model file')\n",
                        {TOOLS_GROUP: {"broken": "libra_broken_plugin:Tool"}})
    with pytest.raises(PluginError, match=r"entry point 'broken' = 'libra_broken_plugin:Tool' "
                                          r"\(group libra.tools\) failed to load: "
                                          r"RuntimeError: missing model file"):
        entry.build_core(ToolGatewayConfig())
    with caplog.at_level(logging.ERROR):
        assert entry.run(ToolGatewayConfig()) == 2
    assert "refusing to start" in caplog.text and "'broken'" in caplog.text


def test_an_entry_point_that_is_not_a_reward_is_refused(tmp_path, monkeypatch):
    install_plugin_dist(tmp_path, monkeypatch, "libra_wrong_plugin", "class NotAReward:\n"
                        "    name = 'x'\n    description = ''\n",
                        {REWARDS_GROUP: {"x": "libra_wrong_plugin:NotAReward"}})
    with pytest.raises(PluginError, match="entry point 'x'.*async def score"):
        entry.build_core(ToolGatewayConfig())
