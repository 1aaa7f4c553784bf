"""``task.agent = "external"`` in the job spec: a built-in name (the registry lists it),
a chat tool-call format, and a positive episode idle timeout."""

from __future__ import annotations

import pytest

from libra.agents import BUILTIN_AGENTS, EXTERNAL
from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_dict


def spec(**task: object) -> dict:
    return {"name": "ext", "model": {"kind": "hf", "path": "/models/m"},
            "task": {"name": "calc-words", "tool_call_format": "hermes", "agent": "external",
                     **task}}


def test_external_is_a_built_in_agent_with_an_idle_timeout() -> None:
    parsed = job_spec_from_dict(spec(episode_idle_timeout_s=30.0))
    assert EXTERNAL in BUILTIN_AGENTS
    assert (parsed.task.agent, parsed.task.episode_idle_timeout_s) == ("external", 30.0)


def test_the_external_agent_needs_a_chat_format() -> None:
    with pytest.raises(InvalidArgument) as refused:
        job_spec_from_dict({"name": "ext", "task": {"agent": "external"}})
    assert refused.value.field == "task.agent"


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, float("inf")])
def test_a_non_positive_idle_timeout_is_refused(timeout_s: float) -> None:
    with pytest.raises(InvalidArgument) as refused:
        job_spec_from_dict(spec(episode_idle_timeout_s=timeout_s))
    assert refused.value.field == "task.episode_idle_timeout_s"


def test_the_batch_window_defaults_to_50_ms_and_may_be_off() -> None:
    assert job_spec_from_dict(spec()).task.episode_batch_window_ms == 50.0
    assert job_spec_from_dict(spec(episode_batch_window_ms=0)).task.episode_batch_window_ms == 0


@pytest.mark.parametrize("window_ms", [-1.0, 1000.5, float("inf"), float("nan")])
def test_a_batch_window_out_of_range_is_refused(window_ms: float) -> None:
    with pytest.raises(InvalidArgument) as refused:
        job_spec_from_dict(spec(episode_batch_window_ms=window_ms))
    assert refused.value.field == "task.episode_batch_window_ms"
