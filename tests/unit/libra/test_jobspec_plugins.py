"""The spec's plugin fields: ``[reward]`` (names by syntax only, composite components,
``[reward.llm_judge]``, the failure budget) and ``task.agent`` (built-ins in
libra/agents.py plus ``libra.agents`` entry points, checked from metadata); the score
request's wire codec."""

from __future__ import annotations

import json
import sys

import pytest

from libra import agents
from libra import types as t
from libra.agents import BUILTIN_AGENTS, agent_names, check_agent_name
from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_json, parse_job_spec
from libra.plugins import AGENTS_GROUP
from libra.wire.toolgateway import (
    score_input_from_proto,
    score_input_to_proto,
    score_output_from_proto,
    score_output_to_proto,
)
from tests.fixtures.plugin_dist import install_plugin_dist

JUDGE = ('[reward.llm_judge]\nbase_url = "http://judge:8000"\nmodel = "m"\n'
         'api_key_env = "JUDGE_KEY"\nprompt_template = "{answer} vs {reference}"\n')


def spec(extra: str = "", task: str = "") -> str:
    return f'name = "t"\n[task]\n{task}\n[algorithm]\nnum_steps = 2\n{extra}'


def test_any_well_formed_tool_or_reward_name_passes_the_spec() -> None:
    parsed = parse_job_spec(spec('[reward]\nname = "my_verifier"\n[tools]\n'
                                 'enabled = ["calculator", "my.tool-2"]\n'))
    assert (parsed.reward.name, parsed.tools.enabled) == ("my_verifier", ["calculator",
                                                                         "my.tool-2"])


def test_a_composite_with_a_judge_round_trips_with_its_options() -> None:
    text = spec('[reward]\nname = "composite"\nmax_failures = 5\n'
                '[[reward.components]]\nname = "llm_judge"\nweight = 0.7\n'
                '[[reward.components]]\nname = "format"\nweight = 0.3\n' + JUDGE)
    parsed = parse_job_spec(text)
    assert job_spec_from_json(parsed.to_json()) == parsed
    options = json.loads(parsed.reward.options_json())
    assert options["components"] == [{"name": "llm_judge", "weight": 0.7},
                                     {"name": "format", "weight": 0.3}]
    assert options["llm_judge"]["api_key_env"] == "JUDGE_KEY"
    assert "api_key" not in options["llm_judge"]  # the key itself never enters the spec
    assert parsed.reward.max_failures == 5


@pytest.mark.parametrize("extra, field, reason", [
    ('[reward]\nname = "2bad"\n', "reward.name", "not a plugin name"),
    ('[tools]\nenabled = ["calculator", "a b"]\n', "tools.enabled[1]", "not a plugin name"),
    ('[reward]\nname = "composite"\n', "reward.components", "exactly when"),
    ('[reward]\nname = "exact_match"\n[[reward.components]]\nname = "format"\n',
     "reward.components", "exactly when"),
    ('[reward]\nname = "composite"\n[[reward.components]]\nname = "composite"\n',
     "reward.components[0].name", "cannot contain a composite"),
    ('[reward]\nname = "composite"\n[[reward.components]]\nname = "format"\nweight = -1.0\n',
     "reward.components[0].weight", ">= 0"),
    ('[reward]\nname = "composite"\n[[reward.components]]\nname = "format"\nweight = 0.0\n',
     "reward.components", "not all be 0"),
    ('[reward]\nname = "llm_judge"\n', "reward.llm_judge.base_url", "required"),
    ('[reward]\nname = "llm_judge"\n' + JUDGE.replace("{reference}", "{secret}"),
     "reward.llm_judge.prompt_template", "unknown field(s) ['secret']"),
    ('[reward]\nname = "llm_judge"\n' + JUDGE.replace('"JUDGE_KEY"', '"sk-123 real key"'),
     "reward.llm_judge.api_key_env", "environment variable name"),
    ('[reward]\nname = "llm_judge"\n' + JUDGE + 'requests_per_s = 0.0\n',
     "reward.llm_judge.requests_per_s", "> 0"),
    ('[reward]\nmax_failures = 0\n', "reward.max_failures", ">= 1"),
    ('[reward]\ntimeout_s = 0.0\n', "reward.timeout_s", "> 0"),
])
def test_bad_reward_sections_are_refused_naming_the_field(extra, field, reason) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_job_spec(spec(extra))
    assert err.value.field == field and reason in err.value.reason


# -- task.agent -----------------------------------------------------------------------------

@pytest.mark.parametrize("task, field, reason", [
    ('agent = "chat"', "task.agent", "needs a chat tool_call_format"),
    ('agent = "no agent"', "task.agent", "not a plugin name"),
])
def test_bad_agents_are_refused_by_the_spec(task, field, reason) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_job_spec(spec(task=task))
    assert err.value.field == field and reason in err.value.reason


def test_an_unknown_agent_is_refused_listing_the_available_ones() -> None:
    with pytest.raises(InvalidArgument) as err:
        check_agent_name("react")
    assert err.value.field == "task.agent"
    assert "unknown agent 'react' (available: auto, arith, chat" in err.value.reason


def test_a_builtin_agent_is_checked_without_reading_installed_metadata(monkeypatch):
    def no_scan(group: str) -> list[str]:
        raise AssertionError(f"scanned the {group} entry points for a built-in agent")

    monkeypatch.setattr(agents, "entry_point_names", no_scan)
    for name in BUILTIN_AGENTS:
        check_agent_name(name)
    with pytest.raises(AssertionError, match="scanned the libra.agents entry points"):
        check_agent_name("react")  # a plugin name still looks them up


def test_an_installed_agent_plugin_is_known_without_importing_it(tmp_path, monkeypatch):
    install_plugin_dist(tmp_path, monkeypatch, "libra_agent_names",
                        "raise ImportError('never imported by the coordinator')\n",
                        {AGENTS_GROUP: {"react": "libra_agent_names:React"}})
    check_agent_name("react")
    assert agent_names() == [*BUILTIN_AGENTS, "react"]
    assert "libra_agent_names" not in sys.modules


# -- the Score request on the wire ----------------------------------------------------------

def test_score_input_and_output_round_trip_through_the_wire() -> None:
    req = t.ScoreInput("tr", "composite", "4", "4", (
        t.TranscriptMessage("user", "2+2?"),
        t.TranscriptMessage("assistant", "<calc>", (t.TranscriptToolCall("calculator",
                                                                         '{"e": 1}'),)),
        t.TranscriptMessage("tool", "4", name="calculator", tool_status="success")),
        '{"k": 1}', 2, '{"timeout_s": 3}')
    assert score_input_from_proto(score_input_to_proto(req)) == req
    out = t.ScoreOutput(0.75, {"exact_match": 1.0, "format": 0.5})
    assert score_output_from_proto(score_output_to_proto(out)) == out
