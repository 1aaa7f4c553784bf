"""``[reward]`` of the job spec: which reward scores a trajectory, composite weights, the
per-job LLM judge, and the failure budget (docs/jobspec.md, docs/plugins.md).

Names are checked for syntax here only: which rewards exist is the tool gateway's
registry (built-ins, ``libra.rewards`` entry points, dotted paths), and the coordinator
checks the names against its ListRewards at submit.
"""

from __future__ import annotations

import json
import math
import re
import string
from dataclasses import asdict, dataclass, field
from typing import Any

from libra.errors import InvalidArgument

# A registered plugin name (tool, reward, agent): what an entry point may be called.
PLUGIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
COMPOSITE = "composite"
LLM_JUDGE = "llm_judge"
# Fields a judge prompt template may use (str.format names).
JUDGE_TEMPLATE_FIELDS = ("question", "reference", "answer", "transcript")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Starts ``failure_reason`` of a trajectory whose reward failed (rollout sets it, the
# trainer counts it against ``max_failures``).
REWARD_FAILURE_PREFIX = "reward failed:"


@dataclass(frozen=True, kw_only=True)
class RewardComponent:
    """``[[reward.components]]``: one part of a composite reward."""

    name: str
    weight: float = 1.0


@dataclass(frozen=True, kw_only=True)
class LlmJudgeSpec:
    """``[reward.llm_judge]``: an OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    base_url: str = ""
    model: str = ""
    prompt_template: str = ""
    """``str.format`` text with {question}, {reference}, {answer}, {transcript}; empty:
    the gateway's default prompt."""
    requests_per_s: float = 5.0
    timeout_s: float = 30.0
    api_key_env: str = ""
    """Name of the environment variable (on the tool gateway) holding the API key; the
    key itself is never stored in the spec."""
    max_tokens: int = 16


@dataclass(frozen=True, kw_only=True)
class RewardSpec:
    """``[reward]``: the reward that scores a trajectory (checked against the gateway's
    registry at submit), a composite's parts, the judge and the failure budget."""

    name: str = "exact_match"
    components: list[RewardComponent] = field(default_factory=list)
    """``composite``: the rewards summed, each times its weight."""
    llm_judge: LlmJudgeSpec = field(default_factory=LlmJudgeSpec)
    timeout_s: float = 30.0
    """Longest a reward may take for one trajectory (the trajectory fails after it)."""
    max_failures: int = 20
    """Trajectories whose reward failed (raised, timed out, non-finite or out-of-range
    score) before the job fails, naming the reward and the last error."""

    def names(self) -> list[str]:
        """Every reward the job calls: the reward and a composite's components."""
        return [self.name] + [c.name for c in self.components]

    def options(self) -> dict[str, Any]:
        """The job-level settings sent with every Score call."""
        opts: dict[str, Any] = {"timeout_s": self.timeout_s}
        if self.components:
            opts["components"] = [{"name": c.name, "weight": c.weight} for c in self.components]
        if self.llm_judge.base_url:
            opts[LLM_JUDGE] = asdict(self.llm_judge)
        return opts

    def options_json(self) -> str:
        """:meth:`options` as sorted JSON (``ScoreInput.options_json``)."""
        return json.dumps(self.options(), sort_keys=True)


def _require(ok: bool, path: str, reason: str) -> None:
    if not ok:
        raise InvalidArgument(path, reason)


def check_plugin_name(name: str, path: str) -> None:
    """Raise InvalidArgument(path) unless ``name`` can be a registered plugin name."""
    _require(bool(PLUGIN_NAME.fullmatch(name)), path,
             f"{name!r} is not a plugin name (a letter, then letters, digits, _ . -)")


def validate_reward(r: RewardSpec) -> None:
    """Syntax and ranges of ``[reward]``; raises InvalidArgument naming the field."""
    check_plugin_name(r.name, "reward.name")
    _require(r.timeout_s > 0 and math.isfinite(r.timeout_s), "reward.timeout_s", "must be > 0")
    _require(r.max_failures >= 1, "reward.max_failures", "must be >= 1")
    _require((r.name == COMPOSITE) == bool(r.components), "reward.components",
             "required (at least one) exactly when reward.name is 'composite'")
    for i, c in enumerate(r.components):
        check_plugin_name(c.name, f"reward.components[{i}].name")
        _require(c.name != COMPOSITE, f"reward.components[{i}].name",
                 "a composite cannot contain a composite")
        _require(math.isfinite(c.weight) and c.weight >= 0, f"reward.components[{i}].weight",
                 "must be a finite number >= 0")
    if r.components:
        _require(sum(c.weight for c in r.components) > 0, "reward.components",
                 "the weights must not all be 0")
    if LLM_JUDGE in r.names():
        _validate_judge(r.llm_judge)


def _validate_judge(j: LlmJudgeSpec) -> None:
    _require(j.base_url.startswith(("http://", "https://")), "reward.llm_judge.base_url",
             "required for llm_judge: the endpoint root, e.g. http://judge:8000")
    _require(bool(j.model.strip()), "reward.llm_judge.model", "required for llm_judge")
    _require(j.requests_per_s > 0, "reward.llm_judge.requests_per_s", "must be > 0")
    _require(j.timeout_s > 0, "reward.llm_judge.timeout_s", "must be > 0")
    _require(j.max_tokens >= 1, "reward.llm_judge.max_tokens", "must be >= 1")
    _require(not j.api_key_env or bool(_ENV_NAME.fullmatch(j.api_key_env)),
             "reward.llm_judge.api_key_env", "must be an environment variable name")
    try:
        used = {f for _, f, _, _ in string.Formatter().parse(j.prompt_template) if f is not None}
    except ValueError as exc:
        raise InvalidArgument("reward.llm_judge.prompt_template", str(exc)) from exc
    unknown = sorted(used - set(JUDGE_TEMPLATE_FIELDS))
    _require(not unknown, "reward.llm_judge.prompt_template",
             f"unknown field(s) {unknown}; use {', '.join(JUDGE_TEMPLATE_FIELDS)}")
