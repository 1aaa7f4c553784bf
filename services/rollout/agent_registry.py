"""The rollout's agent registry: ``task.agent`` -> a factory ``(spec, tokenizer) -> Agent``.

Built-ins (``arith``, ``chat``, ``external``: services/rollout/external_agent.py;
``auto`` picks one by ``task.tool_call_format``) plus the ``libra.agents`` entry points
of installed distributions. The names' one list is
libra/agents.py (the coordinator checks a spec against it without importing plugins);
this module maps them to code. An entry point names a factory: a class whose
constructor takes ``(spec, tokenizer)`` (e.g. a subclass of ``ChatAgent``'s parent
helpers) or a function returning an ``Agent``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from libra import agents as names
from libra.chat.job import chat_format
from libra.jobspec import JobSpec
from libra.plugins import AGENTS_GROUP, PluginError, load_entry_point
from services.rollout.agent import Agent, ArithAgent, ChatAgent, Tokenizer
from services.rollout.external_agent import ExternalAgent

logger = logging.getLogger(__name__)
AgentFactory = Callable[[JobSpec, Tokenizer], Agent]
_REQUIRED = ("start", "next_request", "apply_generation", "apply_tool_results", "transcript")


def _chat_agent(spec: JobSpec, tokenizer: Tokenizer) -> Agent:
    return ChatAgent(spec, tokenizer, chat_format(spec, tokenizer.tokenizer))


def _external_agent(spec: JobSpec, tokenizer: Tokenizer) -> Agent:
    return ExternalAgent(spec, tokenizer, chat_format(spec, tokenizer.tokenizer))


def _builtin_factories() -> dict[str, AgentFactory]:
    return {names.ARITH: ArithAgent, names.CHAT: _chat_agent, names.EXTERNAL: _external_agent}


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
    # Only the job's own plugin is imported: a broken neighbour must not take it down.
    factory = _builtin_factories().get(name) or load_entry_point(AGENTS_GROUP, name)
    if factory is None:
        raise PluginError(f"unknown agent {name!r} (available: "
                          f"{', '.join(names.agent_names()[1:])})")
    return _check_agent(factory(spec, tokenizer), name)


class AgentUnavailable(ValueError):
    """The job's agent cannot be built on this rollout (its start fails every trajectory)."""


class _UnavailableAgent:
    """Stands in for an agent that failed to build: each trajectory of the job fails at
    ``start`` with the reason (named entry point and error), visible in the job's
    failures, instead of the rollout's loop dying on every job it serves."""

    max_context_tokens = 0

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def start(self, traj: Any) -> None:
        raise AgentUnavailable(self.reason)

    def _never(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a trajectory of an unavailable agent never starts")

    next_request = apply_generation = apply_tool_results = transcript = _never


def build_agent_or_stand_in(spec: JobSpec, tokenizer: Tokenizer) -> Agent:
    """``build_agent``, or (on ``PluginError``) a stand-in that fails the job's
    trajectories with ``agent unavailable: <the error>`` (the trainer then fails the job
    with it)."""
    try:
        return build_agent(spec, tokenizer)
    except PluginError as exc:
        logger.error("[job] agent %r unavailable on this rollout: %s", spec.task.agent, exc)
        return _UnavailableAgent(f"{names.AGENT_FAILURE_PREFIX} {exc}")
