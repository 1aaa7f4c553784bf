"""Upper bounds of a job spec: sizes, counts and numeric maxima (docs/jobspec.md).

``libra.jobspec`` checks lower bounds and meaning; this module checks that nothing is
absurdly large, so a spec cannot stall the coordinator (a 50 MB name), freeze the
scheduler (10,000 buckets), run for ever (``num_steps = 2**63 - 1``) or ask for a model
no machine holds. Every check raises ``InvalidArgument`` naming the field.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from libra.errors import InvalidArgument
from libra.limits import MAX_NUM_STEPS, MAX_SPEC_BYTES, check_encodable, check_name

# Longest string in any spec field (paths, prompts, templates); the document is
# bounded by MAX_SPEC_BYTES anyway, this keeps one field from being most of it.
MAX_FIELD_CHARS = 64 * 1024
MAX_PATH_CHARS = 4096
# Integers a spec may hold at all: the largest a JSON double represents exactly.
MAX_SPEC_INT = (1 << 53) - 1
MAX_BUCKETS = 64
MAX_TOOLS = 16
MAX_SEARCH_CORPUS_FILES = 64
MAX_REWARD_COMPONENTS = 16
# Training memory of a float32 model under Adam: weights, gradients and two moments.
TRAIN_BYTES_PER_PARAM = 16
# Parameters of the built-in tiny Llama beyond the layers (embeddings and head).
TINY_VOCAB = 512

# Field -> largest value. Lower bounds live with the meaning, in libra/jobspec.py.
MAXIMA: dict[str, float] = {
    "algorithm.num_steps": MAX_NUM_STEPS,
    "algorithm.prompts_per_step": 4096,
    "algorithm.samples_per_prompt": 256,
    "algorithm.learning_rate": 1.0,
    "algorithm.kl_coef": 100.0,
    "algorithm.is_cap": 1e6,
    "algorithm.max_grad_norm": 1e6,
    "algorithm.max_staleness": 1000,
    "algorithm.sync_interval": MAX_NUM_STEPS,
    "algorithm.temperature": 100.0,
    "algorithm.sft_steps": MAX_NUM_STEPS,
    "algorithm.sft_learning_rate": 1.0,
    "algorithm.sft_batch_size": 4096,
    "algorithm.checkpoint_interval": MAX_NUM_STEPS,
    "algorithm.micro_batch_size": 4096,
    "algorithm.keep_weight_versions": 10_000,
    "model.hidden_size": 16_384,
    "model.num_layers": 256,
    "model.num_heads": 256,
    "model.intermediate_size": 65_536,
    "model.max_position_embeddings": 131_072,
    "task.num_prompts": 10_000_000,
    "task.num_epochs": 1_000_000,
    "tools.call_timeout_s": 3600.0,
    "reward.timeout_s": 3600.0,
    "reward.max_failures": 1_000_000,
    "layout.cmlfq.rebuild_interval_steps": MAX_NUM_STEPS,
    "layout.cmlfq.recent_window_trajectories": 10_000_000,
    "layout.cmlfq.p90_window_samples": 1_000_000,
    "layout.cmlfq.tree_persist_interval_finishes": 10_000_000,
    "layout.cmlfq.min_node_visits": 10_000_000,
    "layout.cmlfq.max_queue_length": 1000,
    "elastic.reserve_workers": 100_000,
    "elastic.borrow_ratio": 100.0,
    "elastic.release_ratio": 100.0,
    "elastic.ttl_steps": MAX_NUM_STEPS,
    "elastic.plan_interval_steps": MAX_NUM_STEPS,
    "elastic.cooldown_steps": MAX_NUM_STEPS,
    "elastic.min_dwell_steps": MAX_NUM_STEPS,
    "elastic.force_hybrids": 100_000,
    "elastic.warmup_steps": MAX_NUM_STEPS,
    "elastic.transition_cost_s": 86_400.0,
    "elastic.min_gain_ratio": 100.0,
    "elastic.join_timeout_s": 86_400.0,
    "elastic.gradient_deadline_s": 86_400.0,
    "elastic.lockstep_check_interval": MAX_NUM_STEPS,
}
BUCKET_MAXIMA: dict[str, int] = {
    "max_tokens": 1 << 20, "tp_degree": 64, "max_batch_size": 4096,
    "max_trajectories_per_instance": 65_536,
}
COUNTS: dict[str, int] = {
    "layout.buckets": MAX_BUCKETS, "tools.enabled": MAX_TOOLS,
    "tools.search_corpus": MAX_SEARCH_CORPUS_FILES, "tools.schemas": MAX_TOOLS,
    "reward.components": MAX_REWARD_COMPONENTS,
}


def check_document_text(text: str) -> None:
    """The raw document: at most MAX_SPEC_BYTES of UTF-8, no lone surrogates."""
    if len(text) > MAX_SPEC_BYTES:  # chars <= bytes: a cheap first cut before encoding
        raise InvalidArgument("spec", f"{len(text)} characters, at most {MAX_SPEC_BYTES} bytes")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument("spec", f"not valid Unicode text: {exc.reason}") from exc
    if size > MAX_SPEC_BYTES:
        raise InvalidArgument("spec", f"{size} bytes, at most {MAX_SPEC_BYTES}")


def check_document_values(data: Any) -> None:
    """Every key and string of a parsed document encodes (a JSON ``"\\ud800"`` escape
    parses to a lone surrogate, which Redis and the JSON encoders refuse later)."""
    check_encodable(data, "spec")


def _get(spec: Any, path: str) -> Any:
    value = spec
    for part in path.split("."):
        value = getattr(value, part)
    return value


def validate_limits(spec: Any) -> None:
    """Upper bounds of a built spec (a ``libra.jobspec.JobSpec``)."""
    check_name(spec.name, "name")
    _check_strings(spec, "")
    for path, limit in COUNTS.items():
        count = len(_get(spec, path))
        if count > limit:
            raise InvalidArgument(path, f"{count} entries, at most {limit}")
    for path, high in MAXIMA.items():
        value = _get(spec, path)
        if value > high:
            raise InvalidArgument(path, f"{value!r} is above the maximum {high:g}")
    for i, bucket in enumerate(spec.layout.buckets):
        for name, high in BUCKET_MAXIMA.items():
            if getattr(bucket, name) > high:
                raise InvalidArgument(f"layout.buckets[{i}].{name}",
                                      f"{getattr(bucket, name)} is above the maximum {high}")
    for i, path in enumerate(spec.tools.search_corpus):
        if len(path) > MAX_PATH_CHARS:
            raise InvalidArgument(f"tools.search_corpus[{i}]",
                                  f"a path of at most {MAX_PATH_CHARS} characters")
    if spec.model.kind == "tiny-llama":
        _check_model_memory(spec.model)


def _check_strings(node: Any, prefix: str) -> None:
    """Every string field: at most MAX_FIELD_CHARS (paths: MAX_PATH_CHARS)."""
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            where = f"{path}[{i}]" if isinstance(value, list) else path
            if dataclasses.is_dataclass(item):
                _check_strings(item, f"{where}.")
            elif isinstance(item, str):
                high = MAX_PATH_CHARS if f.name.endswith("path") else MAX_FIELD_CHARS
                if len(item) > high:
                    raise InvalidArgument(where, f"{len(item)} characters, at most {high}")


def tiny_llama_params(model: Any) -> int:
    """Parameters of the built-in Llama: per layer attention (4 h^2) and the gated MLP
    (3 h i), plus embeddings and head (2 v h)."""
    h, i = model.hidden_size, model.intermediate_size
    return model.num_layers * (4 * h * h + 3 * h * i) + 2 * TINY_VOCAB * h


def physical_memory_bytes() -> int:
    """This machine's RAM (0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _check_model_memory(model: Any) -> None:
    # The coordinator's host stands in for the trainer's: a model that needs more than
    # all of it would fail to allocate on any single-host stack (the demo's layout).
    need = tiny_llama_params(model) * TRAIN_BYTES_PER_PARAM
    have = physical_memory_bytes()
    if have and need > have:
        raise InvalidArgument("model.hidden_size", f"the model needs about {need / 2**30:.1f} "
                              f"GiB to train (float32 + Adam), more than this machine's "
                              f"{have / 2**30:.1f} GiB; make hidden_size, intermediate_size "
                              "or num_layers smaller")
