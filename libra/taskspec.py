"""``[task]`` of the job spec: where prompts come from and how the agent loop runs.

Part of libra/jobspec.py (which re-exports :class:`TaskSpec`), split out because the
dataset fields and their rules are a subject of their own. Schema: docs/jobspec.md;
datasets: docs/datasets.md.

``kind`` and ``name``: ``kind`` picks the prompt source from the registry
``libra.data.DATASET_KINDS`` (built-in tasks and file kinds). ``name`` is the older
spelling for built-ins: a spec without ``kind`` means the built-in task ``name`` (so
every existing spec keeps its meaning), and a spec with ``kind`` must leave ``name``
out or equal to ``kind``; after parsing, ``name == kind`` whenever ``kind`` is given.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from libra.data.registry import BUILTIN_KINDS, DATASET_KINDS, FILE_KINDS
from libra.errors import InvalidArgument

SUPPORTED_TASK_KINDS = tuple(DATASET_KINDS)
MAX_EVAL_FRACTION = 0.5
_MAPPING_FIELDS = ("prompt_field", "messages_field", "reference_field", "metadata_field",
                   "demonstration_field")


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """``[task]``: where prompts come from (a built-in task or a dataset file and its column
    mapping), how the model calls tools, and the turn limits."""

    name: str = "arith"
    """Built-in task (``arith``, ``calc-words``) when ``kind`` is empty; see the module."""
    kind: str = ""
    """Prompt source: a built-in task, ``jsonl``, ``parquet`` or ``hf-dataset``."""
    path: str = ""
    """File kinds: the local file (jsonl, parquet) or save_to_disk folder (hf-dataset)."""
    split: str = "train"
    """``hf-dataset``: the split of a DatasetDict folder (files have one: ``train``)."""
    prompt_field: str = ""
    """File kinds: the column holding the text prompt (or set ``messages_field``)."""
    messages_field: str = ""
    """File kinds: the column holding the prompt as chat messages (chat formats only)."""
    reference_field: str = ""
    """File kinds: the column the reward compares the answer with."""
    metadata_field: str = ""
    """File kinds, optional: a column carried with the row as JSON."""
    demonstration_field: str = ""
    """File kinds, optional: a warm-start conversation per row (needed when
    ``algorithm.sft_steps`` > 0)."""
    eval_path: str = ""
    """Held-out rows from another file of the same kind and mapping."""
    eval_fraction: float = 0.0
    """Held-out rows as a seeded share of the dataset (exclusive with ``eval_path``)."""
    shuffle_seed: int = -1
    """Seeds the epoch shuffles and the held-out draw; -1 takes ``seed``."""
    num_epochs: int = 0
    """Passes over the training rows the job may take (0: no limit; checked at submit)."""
    num_prompts: int = 512
    """Built-ins: prompts generated. File kinds: first N training rows (0, the default
    for files: all)."""
    seed: int = 0
    """Built-ins: generation seed; all kinds: the shuffle seed unless ``shuffle_seed``."""
    max_turns: int = 6
    max_new_tokens_per_turn: int = 24
    tool_call_format: str = "arith"
    system_prompt: str = ""
    """``hermes``: the system message (empty: the task's default)."""
    agent: str = "auto"
    """The agent loop: ``auto`` (by tool_call_format), ``arith``, ``chat``, or a
    ``libra.agents`` entry point installed on the rollout (libra/agents.py), or
    ``external``: agent programs call the OpenAI-compatible endpoint (docs/agent-endpoint.md)."""
    episode_idle_timeout_s: float = 120.0
    """``external``: how long an episode may wait for its program's next call (or its
    first, after the offer) before its trajectory is dropped and counted."""
    episode_batch_window_ms: float = 50.0
    """``external``: the longest an engine call waits for episodes' calls expected soon
    (at most one engine call's time; services/rollout/batch_window.py; 0: no wait)."""
    eval_interval: int = 0
    """Held-out eval every this many training steps, plus before the first and after the
    last (0: off; needs ``eval_path`` or ``eval_fraction``). See libra/evaluation.py."""
    eval_samples_per_prompt: int = 1
    """Samples per eval prompt (the n of pass@k; > 1 needs ``eval_temperature`` > 0)."""
    eval_temperature: float = 0.0
    """Sampling temperature of eval turns (0: greedy)."""
    eval_max_prompts: int = 64
    """Eval prompts per round: the first this many held-out rows (every round the same)."""
    eval_correct_reward: float = 1.0
    """A sample counts as correct (accuracy, pass@k) when its reward is >= this."""
    eval_timeout_s: float = 300.0
    """How long the job waits after its last step for the final eval round."""

    @property
    def resolved_kind(self) -> str:
        """The registry entry this task reads from (``kind``, else the built-in ``name``)."""
        return self.kind or self.name

    @property
    def order_seed(self) -> int:
        """Seed of the epoch shuffles and the held-out draw."""
        return self.shuffle_seed if self.shuffle_seed >= 0 else self.seed

    @property
    def is_file(self) -> bool:
        """Whether the prompts come from a file dataset."""
        return self.resolved_kind in FILE_KINDS


def normalise_task(task: TaskSpec, raw: Any) -> TaskSpec:
    """Fill what the document left implicit: ``name`` becomes ``kind`` when ``kind`` is
    given, and a file dataset without ``num_prompts`` uses all rows.

    ``raw`` is the document's ``[task]`` table (to tell a default from a given value).
    Idempotent: the stored, normalised spec parses to itself.
    """
    raw = raw if isinstance(raw, dict) else {}
    if not task.kind:
        return task
    if raw.get("name", task.kind) != task.kind:
        raise InvalidArgument("task.name", f"{raw['name']!r} conflicts with task.kind = "
                              f"{task.kind!r}: name is the older spelling of a built-in "
                              "kind; give kind only")
    changes: dict[str, Any] = {"name": task.kind}
    if task.kind in FILE_KINDS and "num_prompts" not in raw:
        changes["num_prompts"] = 0
    return dataclasses.replace(task, **changes)


def _require(ok: bool, path: str, reason: str) -> None:
    if not ok:
        raise InvalidArgument(path, reason)


def validate_task_source(task: TaskSpec, *, prompts_per_step: int, sft_steps: int) -> None:
    """The dataset fields of ``[task]`` (types are checked by the parser)."""
    if task.kind:
        _require(task.kind in DATASET_KINDS, "task.kind", f"one of {SUPPORTED_TASK_KINDS}")
    else:
        _require(task.name in BUILTIN_KINDS, "task.name", f"one of {BUILTIN_KINDS}")
    _require(0.0 <= task.eval_fraction <= MAX_EVAL_FRACTION and math.isfinite(task.eval_fraction),
             "task.eval_fraction", f"must be in [0, {MAX_EVAL_FRACTION}]")
    _require(not (task.eval_path and task.eval_fraction > 0), "task.eval_fraction",
             "give eval_path or eval_fraction, not both")
    _require(task.shuffle_seed >= -1, "task.shuffle_seed", "must be >= 0, or -1 (task.seed)")
    _require(task.num_epochs >= 0, "task.num_epochs", "must be >= 0 (0 = no limit)")
    if task.is_file:
        _validate_file_task(task, prompts_per_step, sft_steps)
    else:
        _validate_builtin_task(task, prompts_per_step)
    _validate_eval(task)
    _require(math.isfinite(task.episode_idle_timeout_s) and task.episode_idle_timeout_s > 0,
             "task.episode_idle_timeout_s", "must be > 0 seconds")
    _require(math.isfinite(task.episode_batch_window_ms)
             and 0 <= task.episode_batch_window_ms <= MAX_EPISODE_BATCH_WINDOW_MS,
             "task.episode_batch_window_ms",
             f"must be in [0, {MAX_EPISODE_BATCH_WINDOW_MS:g}] ms (0 = no window)")


# A window is a share of one engine call; one past a second only adds latency.
MAX_EPISODE_BATCH_WINDOW_MS = 1000.0


MAX_EVAL_SAMPLES, MAX_EVAL_PROMPTS = 64, 10_000


def _validate_eval(task: TaskSpec) -> None:
    """The held-out evaluation fields (libra/evaluation.py)."""
    _require(task.eval_interval >= 0, "task.eval_interval", "must be >= 0 (0 = no eval)")
    if task.eval_interval == 0:
        return
    _require(bool(task.eval_path) or task.eval_fraction > 0, "task.eval_interval",
             "eval needs held-out rows: set task.eval_path or task.eval_fraction")
    _require(1 <= task.eval_samples_per_prompt <= MAX_EVAL_SAMPLES,
             "task.eval_samples_per_prompt", f"must be in [1, {MAX_EVAL_SAMPLES}]")
    _require(math.isfinite(task.eval_temperature) and task.eval_temperature >= 0,
             "task.eval_temperature", "must be >= 0 (0 = greedy)")
    _require(task.eval_samples_per_prompt == 1 or task.eval_temperature > 0,
             "task.eval_samples_per_prompt", "greedy samples (eval_temperature = 0) are "
             "all the same: use 1, or set task.eval_temperature > 0 for pass@k")
    _require(1 <= task.eval_max_prompts <= MAX_EVAL_PROMPTS, "task.eval_max_prompts",
             f"must be in [1, {MAX_EVAL_PROMPTS}]")
    _require(math.isfinite(task.eval_correct_reward), "task.eval_correct_reward",
             "must be a finite number")
    _require(math.isfinite(task.eval_timeout_s) and task.eval_timeout_s > 0,
             "task.eval_timeout_s", "must be > 0")


def _validate_builtin_task(task: TaskSpec, prompts_per_step: int) -> None:
    kind = task.resolved_kind
    for name in ("path", "eval_path", *_MAPPING_FIELDS):
        _require(not getattr(task, name), f"task.{name}",
                 f"only for file datasets ({', '.join(FILE_KINDS)}); kind is {kind!r}")
    _require(task.split == "train", "task.split", f"only for hf-dataset; kind is {kind!r}")
    _require(task.num_prompts >= prompts_per_step, "task.num_prompts",
             "must be >= algorithm.prompts_per_step")


def _validate_file_task(task: TaskSpec, prompts_per_step: int, sft_steps: int) -> None:
    kind = task.kind
    _require(bool(task.path.strip()), "task.path", f"required for kind = {kind!r}: a local "
             "file or save_to_disk folder")
    for name in _MAPPING_FIELDS:
        value = getattr(task, name)
        _require(value == value.strip(), f"task.{name}", f"{value!r}: no surrounding spaces")
    _require(bool(task.prompt_field) != bool(task.messages_field), "task.prompt_field",
             "set exactly one of task.prompt_field (text) and task.messages_field (chat)")
    _require(bool(task.reference_field), "task.reference_field",
             f"required for kind = {kind!r}: the column the reward compares with")
    _require(kind == "hf-dataset" or task.split == "train", "task.split",
             f"a {kind} file has one split, 'train'; split is for hf-dataset folders")
    _require(bool(task.split.strip()), "task.split", "must not be empty")
    _require(task.num_prompts == 0 or task.num_prompts >= prompts_per_step, "task.num_prompts",
             "0 (all rows) or >= algorithm.prompts_per_step")
    chat = task.tool_call_format != "arith"
    _require(chat or not task.messages_field, "task.messages_field",
             "the arith tag agent renders a text prompt: chat messages need a chat "
             "tool_call_format (hermes)")
    _require(chat or not task.demonstration_field, "task.demonstration_field",
             "demonstrations are chat conversations: they need tool_call_format = hermes")
    _require(sft_steps == 0 or bool(task.demonstration_field), "algorithm.sft_steps",
             f"a {kind} dataset warm-starts on task.demonstration_field: set it, or "
             "sft_steps = 0")
