"""Agent-loop names: the built-ins, listed here once, and the ``libra.agents`` entry
points of installed distributions.

The coordinator checks ``task.agent`` at submit with :func:`check_agent_name`, from
package metadata only: it never imports the plugin (nor the rollout, which owns the
agent classes: services/rollout/agent_registry.py). The agent contract is documented in
services/rollout/agent.py (``Agent``) and docs/plugins.md.
"""

from __future__ import annotations

from libra.errors import InvalidArgument
from libra.plugins import AGENTS_GROUP, entry_point_names

AUTO = "auto"
ARITH = "arith"
CHAT = "chat"
# The agent is a program outside Libra calling the OpenAI-compatible endpoint: each
# trajectory is an episode (libra/episodes.py, docs/agent-endpoint.md).
EXTERNAL = "external"
# Starts ``failure_reason`` of a trajectory whose agent could not be built on its rollout
# (the rollout sets it; the trainer then fails the job with that reason).
AGENT_FAILURE_PREFIX = "agent unavailable:"
# ``auto`` picks by the job's tool-call format: arith -> the tag agent, else the chat agent.
BUILTIN_AGENTS = (AUTO, ARITH, CHAT, EXTERNAL)


def agent_names() -> list[str]:
    """Every name ``task.agent`` may take here: built-ins, then installed plugins."""
    return list(BUILTIN_AGENTS) + [n for n in entry_point_names(AGENTS_GROUP)
                                   if n not in BUILTIN_AGENTS]


def check_builtin_agent(agent: str, tool_call_format: str) -> None:
    """A built-in agent must speak the job's tool-call format (plugins are trusted to).

    Raises:
        InvalidArgument: ``task.agent`` is ``arith`` for a chat format or ``chat`` for the
            arith format.
    """
    if agent == ARITH and tool_call_format != "arith":
        raise InvalidArgument("task.agent", "the arith agent speaks tool_call_format = "
                                            "'arith' only")
    if agent in (CHAT, EXTERNAL) and tool_call_format == "arith":
        raise InvalidArgument("task.agent", f"the {agent} agent needs a chat "
                                            "tool_call_format (hermes)")


def check_agent_name(agent: str) -> None:
    """Raise InvalidArgument("task.agent") unless ``agent`` is built in or installed."""
    # Every submit checks its agent: a built-in needs no scan of the installed
    # distributions' metadata (tens of ms, most of a submit; plugins never shadow one).
    if agent in BUILTIN_AGENTS:
        return
    known = agent_names()
    if agent not in known:
        raise InvalidArgument("task.agent", f"unknown agent {agent!r} (available: "
                                            f"{', '.join(known)})")
