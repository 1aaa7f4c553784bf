"""The rollout's agent registry: ``task.agent`` -> a factory ``(spec, tokenizer) -> Agent``.

Built-ins (``arith``, ``chat``; ``auto`` picks one by ``task.tool_call_format``) plus the
``libra.agents`` entry points of installed distributions. The names' one list is
libra/agents.py (the coordinator checks a spec against it without importing plugins);
this module maps them to code. An entry point names a factory: a class whose
constructor takes ``(spec, tokenizer)`` (e.g. a subclass of ``ChatAgent``'s parent
helpers) or a function returning an ``Agent``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from libra import agents as names
from libra.chat.job import chat_format
from libra.jobspec import JobSpec
from libra.plugins import AGENTS_GROUP, PluginError, load_entry_points
from services.rollout.agent import Agent, ArithAgent, ChatAgent, Tokenizer

AgentFactory = Callable[[JobSpec, Tokenizer], Agent]
_REQUIRED = ("start", "next_request", "apply_generation", "apply_tool_results", "transcript")


def _chat_agent(spec: JobSpec, tokenizer: Tokenizer) -> Agent:
    return ChatAgent(spec, tokenizer, chat_format(spec, tokenizer.tokenizer))


def _builtin_factories() -> dict[str, AgentFactory]:
    return {names.ARITH: ArithAgent, names.CHAT: _chat_agent}


def resolve_agent_name(spec: JobSpec) -> str:
    """``task.agent`` with ``auto`` replaced by the built-in for the tool-call format."""
    if spec.task.agent != names.AUTO:
        return spec.task.agent
    return names.ARITH if spec.task.tool_call_format == "arith" else names.CHAT


def _check_agent(obj: Any, name: str) -> Agent:
    missing = [m for m in _REQUIRED if not callable(getattr(obj, m, None))]
    if missing or not isinstance(getattr(obj, "max_context_tokens", None), int):
        raise PluginError(f"agent {name!r} does not honour the Agent contract (missing "
                          f"{', '.join(missing) or 'max_context_tokens'}): see docs/plugins.md")
    return obj


def build_agent(spec: JobSpec, tokenizer: Tokenizer) -> Agent:
    """The job's agent loop.

    Raises:
        PluginError: The name is neither built in nor an installed ``libra.agents`` entry
            point (the coordinator refuses such a spec at submit), the plugin fails to
            import, or what it builds is not an ``Agent``.
    """
    name = resolve_agent_name(spec)
    factories = _builtin_factories()
    if name not in factories:
        factories.update(load_entry_points(AGENTS_GROUP))
    if name not in factories:
        raise PluginError(f"unknown agent {name!r} (available: {', '.join(sorted(factories))})")
    return _check_agent(factories[name](spec, tokenizer), name)
