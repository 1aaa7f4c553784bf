"""The job spec: what a user submits (TOML, JSON or YAML) and how it is validated.

Validation is strict and names the field: an unknown key, a wrong type or a value out of
range raises ``InvalidArgument("section.field", reason)`` so the REST API answers 400
and gRPC answers INVALID_ARGUMENT, and nothing is created. Schema: docs/jobspec.md.
Reading the document and building the dataclasses (unknown keys, types) is
``libra.spec_document``'s; the ranges and cross-field rules are here, beside the fields
(``[layout]``'s beside its own, in ``libra.layoutspec``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from libra.agents import check_builtin_agent
from libra.chat.protocol import TOOL_TEMPLATES
from libra.chat.toolcalls import PARSERS
from libra.errors import InvalidArgument
from libra.layoutspec import CmlfqSpec as CmlfqSpec  # re-exported
from libra.layoutspec import LayoutSpec, validate_layout
from libra.rewardspec import RewardSpec, check_plugin_name, validate_reward
from libra.spec_document import build_dataclass
from libra.spec_document import parse_document as parse_document
from libra.spec_limits import validate_limits
from libra.tasks import TASKS
from libra.taskspec import TaskSpec, normalise_task, validate_task_source
from libra.tracing import AUTO_SAMPLE_RATIO

SUPPORTED_MODELS = ("tiny-llama", "hf")
SUPPORTED_DTYPES = ("auto", "float32", "bfloat16")
SUPPORTED_TASKS = tuple(TASKS)
# The registries are the only lists: tool-call formats are libra.chat's parsers
# (``PARSERS``), tool templates its ``TOOL_TEMPLATES``; ``layout.policy`` and the C-MLFQ
# rule names are checked against the scheduling policies by the coordinator at submit
# (the foundation may not import the algorithms), so only their type is checked
# (libra.layoutspec).


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """``[model]``: the built-in tiny Llama (``tiny-llama``, shaped by the size fields) or
    a local Hugging Face directory (``hf``, with ``path``; the size fields are ignored)."""

    kind: str = "tiny-llama"
    path: str = ""
    """``hf``: a local model directory (config.json, *.safetensors, tokenizer files)."""
    dtype: str = "auto"
    """``auto`` is float32 on CPU and bfloat16 on CUDA."""
    gradient_checkpointing: bool = False
    """Trainer: recompute activations in backward (less memory, ~30% more compute)."""
    max_context_tokens: int = 0
    """``hf``: longest trajectory (prompt + turns) in tokens; 0 takes the model's
    ``max_position_embeddings`` capped at 4096."""
    tool_template: str = "auto"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 384
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class ToolSchema:
    """An enabled tool as the model sees it: name, description and JSON-schema arguments.

    Filled in by the coordinator at submit from the tool gateway's ListTools (a value
    given in the spec is replaced), so the trainer's warm start and every rollout render
    the same prompt even if the gateway changes later.
    """

    name: str
    description: str = ""
    parameters_json: str = "{}"


@dataclass(frozen=True, kw_only=True)
class ToolsSpec:
    """``[tools]``: which gateway tools the model may call, their time limit and options."""

    enabled: list[str] = field(default_factory=lambda: ["calculator"])
    calculator_transient_failure_rate: float = 0.25
    call_timeout_s: float = 5.0
    search_corpus: list[str] = field(default_factory=list)
    schemas: list[ToolSchema] = field(default_factory=list)

    def options_for(self, tool: str) -> dict[str, Any]:
        """The job-level settings sent with each call of ``tool`` to the tool gateway."""
        if tool == "calculator":
            return {"transient_failure_rate": self.calculator_transient_failure_rate}
        if tool == "search" and self.search_corpus:
            return {"corpus_paths": list(self.search_corpus)}
        return {}


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    """``[algorithm]``: GRPO/PPO hyperparameters, the warm start and the staleness budget."""

    num_steps: int = 600
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    learning_rate: float = 8e-5
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    is_cap: float = 2.0
    max_grad_norm: float = 1.0
    max_staleness: int = 1
    sync_interval: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    sft_steps: int = 2600
    sft_learning_rate: float = 5e-3
    sft_batch_size: int = 16
    checkpoint_interval: int = 5
    micro_batch_size: int = 0
    """Sequences per forward/backward of a training step (0: the whole batch); the
    gradients accumulate to the same update with the activations of fewer sequences."""
    init_from: str = ""
    """Start from another job's weights: a job id (its newest checkpoint under the run
    root) or a checkpoint / run directory (with a "/"). Weights only: fresh optimizer,
    step 0; the warm start is skipped unless ``sft_steps`` is given."""
    keep_weight_versions: int = 3
    """Published weight versions kept on disk (the newest; 0 keeps all). A version a
    live rollout instance has loaded or is loading is never deleted."""
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class ElasticSpec:
    """``[elastic]``: the elastic hybrid pool (rollout workers lent to training).

    Defaults follow the reference's knobs scaled to this project (docs/jobspec.md).
    """

    enabled: bool = False
    reserve_workers: int = 1
    borrow_ratio: float = 1.15
    release_ratio: float = 0.90
    pressure_threshold: float = 0.80
    ttl_steps: int = 20
    plan_interval_steps: int = 5
    cooldown_steps: int = 1
    min_dwell_steps: int = 5
    force_hybrids: int = -1
    warmup_steps: int = 2
    transition_cost_s: float = 1.0
    min_gain_ratio: float = 0.05
    join_timeout_s: float = 60.0
    gradient_deadline_s: float = 10.0
    lockstep_check_interval: int = 1


@dataclass(frozen=True, kw_only=True)
class ObservabilitySpec:
    """``[observability]``: the job's trajectory traces (docs/observability.md)."""

    # Share of trajectories traced, decided at admission; -1: every trajectory while a
    # step trains on at most 64, else about 64 per step (libra.tracing).
    trace_sample_ratio: float = AUTO_SAMPLE_RATIO


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A whole job spec, validated (``parse_job_spec``); every service reads the job from it."""

    name: str = "job"
    model: ModelSpec = field(default_factory=ModelSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    tools: ToolsSpec = field(default_factory=ToolsSpec)
    reward: RewardSpec = field(default_factory=RewardSpec)
    algorithm: AlgorithmSpec = field(default_factory=AlgorithmSpec)
    layout: LayoutSpec = field(default_factory=LayoutSpec)
    elastic: ElasticSpec = field(default_factory=ElasticSpec)
    observability: ObservabilitySpec = field(default_factory=ObservabilitySpec)

    def to_json(self) -> str:
        """The normalised spec as sorted JSON: what the coordinator stores and the services
        parse."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _require(ok: bool, path: str, reason: str) -> None:
    if not ok:
        raise InvalidArgument(path, reason)


def _validate_ranges(spec: JobSpec) -> None:
    a, t = spec.algorithm, spec.task
    _require(bool(spec.name.strip()), "name", "must not be empty")
    _validate_model(spec)
    validate_task_source(t, prompts_per_step=a.prompts_per_step, sft_steps=a.sft_steps)
    _require(t.tool_call_format in PARSERS, "task.tool_call_format",
             f"one of {tuple(PARSERS)} (the parsers of libra/chat/toolcalls.py)")
    _require(spec.model.kind == "hf" or t.tool_call_format == "arith",
             "task.tool_call_format", "the tiny-llama model speaks only the arith format")
    check_plugin_name(t.agent, "task.agent")  # plugins: the coordinator, at submit
    check_builtin_agent(t.agent, t.tool_call_format)
    _require(1 <= t.max_turns <= 64, "task.max_turns", "must be in [1, 64]")
    _require(1 <= t.max_new_tokens_per_turn <= 4096, "task.max_new_tokens_per_turn",
             "must be in [1, 4096]")
    _require(len(spec.tools.enabled) >= 1, "tools.enabled", "at least one tool")
    _require(spec.tools.call_timeout_s > 0, "tools.call_timeout_s", "must be > 0")
    validate_reward(spec.reward)  # the names: the coordinator, against the gateway
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings"):
        _require(getattr(spec.model, name) >= 1, f"model.{name}", "must be >= 1")
    for i, tool in enumerate(spec.tools.enabled):
        check_plugin_name(tool, f"tools.enabled[{i}]")  # which exist: the gateway's list
    # The arith format's agent speaks the calculator protocol; other tools ride along.
    _require(t.tool_call_format != "arith" or spec.tools.enabled[0] == "calculator",
             "tools.enabled", "the arith tool-call format calls the calculator: list it first")
    for i, path in enumerate(spec.tools.search_corpus):
        _require(bool(path.strip()), f"tools.search_corpus[{i}]", "must be a file path")
    _require(0.0 <= spec.tools.calculator_transient_failure_rate < 1.0,
             "tools.calculator_transient_failure_rate", "must be in [0, 1)")
    for name in ("num_steps", "prompts_per_step", "sync_interval", "sft_batch_size"):
        _require(getattr(a, name) >= 1, f"algorithm.{name}", "must be >= 1")
    _require(a.samples_per_prompt >= 2, "algorithm.samples_per_prompt",
             "must be >= 2 (GRPO normalises within a group)")
    _require(a.max_staleness >= 0, "algorithm.max_staleness", "must be >= 0")
    _require(a.sft_steps >= 0, "algorithm.sft_steps", "must be >= 0")
    _require(a.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
    _require(math.isfinite(a.is_cap) and a.is_cap >= 1.0, "algorithm.is_cap",
             "must be a finite number >= 1 (a cap below 1 would down-weight on-policy tokens)")
    _require(a.micro_batch_size >= 0, "algorithm.micro_batch_size",
             "must be >= 0 (0 = the whole batch in one forward/backward)")
    _require(a.init_from == a.init_from.strip(), "algorithm.init_from",
             "no leading or trailing spaces (a job id, or a directory path with a '/')")
    _require(a.keep_weight_versions >= 0, "algorithm.keep_weight_versions",
             "must be >= 0 (0 = keep every published version)")
    _require(a.checkpoint_interval >= 0, "algorithm.checkpoint_interval",
             "must be >= 0 (0 = never checkpoint)")
    _require(a.learning_rate > 0, "algorithm.learning_rate", "must be > 0")
    _require(a.sft_learning_rate > 0, "algorithm.sft_learning_rate", "must be > 0")
    _require(a.max_grad_norm > 0, "algorithm.max_grad_norm", "must be > 0 (the clip norm)")
    _require(0 < a.clip_eps < 1, "algorithm.clip_eps", "must be in (0, 1)")
    _require(a.temperature > 0, "algorithm.temperature", "must be > 0")
    _require(0 < a.top_p <= 1, "algorithm.top_p", "must be in (0, 1]")
    ratio = spec.observability.trace_sample_ratio
    _require(ratio == AUTO_SAMPLE_RATIO or 0.0 <= ratio <= 1.0,
             "observability.trace_sample_ratio", "must be in [0, 1], or -1 (automatic)")


def _validate_model(spec: JobSpec) -> None:
    m = spec.model
    _require(m.kind in SUPPORTED_MODELS, "model.kind", f"one of {SUPPORTED_MODELS}")
    _require(m.dtype in SUPPORTED_DTYPES, "model.dtype", f"one of {SUPPORTED_DTYPES}")
    _require(m.tool_template in TOOL_TEMPLATES, "model.tool_template",
             f"one of {TOOL_TEMPLATES}")
    _require(0 <= m.max_context_tokens <= 1 << 20, "model.max_context_tokens",
             "must be in [0, 1048576] (0 = the model's own limit, capped at 4096)")
    if m.kind == "hf":
        _require(bool(m.path.strip()), "model.path",
                 "required for kind = \"hf\": a local Hugging Face model directory "
                 "(make one from a GGUF file with `libra model import`)")
    else:
        _require(not m.path, "model.path", f"only for kind = \"hf\" (kind is {m.kind!r})")
        _require(m.num_heads >= 1 and m.hidden_size % m.num_heads == 0, "model.hidden_size",
                 "must be divisible by model.num_heads")


def _validate_elastic(e: ElasticSpec) -> None:
    # The executor never lends the last rollout worker, whatever the reserve says.
    _require(e.reserve_workers >= 1, "elastic.reserve_workers",
             "must be >= 1 (rollout keeps at least one worker)")
    for name in ("borrow_ratio", "release_ratio", "transition_cost_s", "min_gain_ratio",
                 "join_timeout_s", "gradient_deadline_s"):
        value = getattr(e, name)
        _require(math.isfinite(value), f"elastic.{name}", "must be a finite number")
    _require(e.release_ratio > 0, "elastic.release_ratio", "must be > 0")
    _require(e.release_ratio < e.borrow_ratio, "elastic.release_ratio",
             f"must be < elastic.borrow_ratio ({e.release_ratio} >= {e.borrow_ratio}); "
             "the gap is the hysteresis band")
    _require(0 < e.pressure_threshold <= 1, "elastic.pressure_threshold",
             "must be in (0, 1]")
    for name in ("ttl_steps", "plan_interval_steps", "lockstep_check_interval"):
        _require(getattr(e, name) >= 1, f"elastic.{name}", "must be >= 1")
    _require(e.force_hybrids >= -1, "elastic.force_hybrids",
             "must be -1 (the planner decides) or a number of hybrids >= 0")
    for name in ("cooldown_steps", "min_dwell_steps", "warmup_steps"):
        _require(getattr(e, name) >= 0, f"elastic.{name}", "must be >= 0")
    _require(e.transition_cost_s >= 0, "elastic.transition_cost_s", "must be >= 0")
    _require(e.min_gain_ratio >= 0, "elastic.min_gain_ratio", "must be >= 0")
    for name in ("join_timeout_s", "gradient_deadline_s"):
        _require(getattr(e, name) > 0, f"elastic.{name}", "must be > 0")


def parse_job_spec(text: str, fmt: str = "toml") -> JobSpec:
    """Parse and validate a job spec document; raises InvalidArgument naming the field."""
    return job_spec_from_dict(parse_document(text, fmt))


def job_spec_from_dict(data: dict[str, Any]) -> JobSpec:
    """Build and validate a spec from a parsed document; raises InvalidArgument naming the field."""
    spec = build_dataclass(JobSpec, data, "")
    spec = dataclasses.replace(spec, task=normalise_task(spec.task, data.get("task")))
    spec = _skip_warm_start_after_init_from(spec, data.get("algorithm"))
    validate_limits(spec)  # first: the checks below may walk lists
    _validate_ranges(spec)
    validate_layout(spec.layout)
    _validate_elastic(spec.elastic)
    return spec


def _skip_warm_start_after_init_from(spec: JobSpec, given: Any) -> JobSpec:
    """``init_from`` starts from trained weights, so the warm start (SFT from scratch)
    is skipped: ``sft_steps`` becomes 0 unless the document gives it. The stored spec
    then says 0, so a reload does not depend on what was given."""
    a = spec.algorithm
    if not a.init_from or (isinstance(given, dict) and "sft_steps" in given):
        return spec
    return dataclasses.replace(spec, algorithm=dataclasses.replace(a, sft_steps=0))


def job_spec_from_json(text: str) -> JobSpec:
    """Load a spec that was already validated (normalised JSON stored with the job)."""
    return job_spec_from_dict(json.loads(text))
