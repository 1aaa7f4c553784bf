"""Submit-time checks of a Hugging Face model directory, without loading its weights.

The coordinator calls :func:`validate_model_for_job` (through
``services/coordinator/model_check.py``) before it stores a job, so a model the trainer
could not load, a tokenizer the task cannot use, or a model too large for this machine
fails ``CreateJob`` with ``INVALID_ARGUMENT`` naming the field, and nothing is created.

Parameters are counted on the meta device (shapes only: milliseconds even for 70B), the
tokenizer is loaded (it is small) to probe the chat template.

Training memory estimate (a lower bound, documented in docs/models.md)::

    weights + gradients       2 x num_params x bytes of the training dtype
    AdamW states              2 x num_params x 4 (exp_avg, exp_avg_sq in float32; torch
                              keeps them in the parameter dtype, so this is an upper
                              bound for bfloat16 parameters)
    activation margin         25% of the above (one micro-batch, allocator slack)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from libra.errors import InvalidArgument
from libra.jobspec import JobSpec
from libra.models.hf import default_device, resolve_dtype

FIELD = "model.path"
ADAMW_STATE_BYTES_PER_PARAM = 8
ACTIVATION_MARGIN_FRACTION = 0.25
# Any one of these makes a loadable tokenizer (fast JSON, SentencePiece, byte-level BPE).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
_PROBE_MESSAGES = [{"role": "system", "content": "You are a careful assistant."},
                   {"role": "user", "content": "What is 12*7?"}]
_PROBE_TOOL = "probe_calculator"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_TOOL, "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]


@dataclass(frozen=True)
class ModelInfo:
    """What a model directory is, and what training it would take."""

    path: str
    architecture: str
    model_type: str
    num_params: int
    dtype: str
    """The training dtype the estimate assumes (``model.dtype`` resolved for the device)."""
    param_bytes: int
    training_memory_bytes: int
    has_chat_template: bool
    template_renders_tools: bool
    """The chat template puts ``tools=`` into the prompt (else Libra's Hermes template
    must carry the tool schemas: ``model.tool_template = "auto"`` or ``"hermes"``)."""
    template_error: str
    """Why rendering a probe conversation failed ("" when it rendered)."""
    max_position_embeddings: int
    eos_token_ids: list[int]
    tie_word_embeddings: bool

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``libra model inspect --json``)."""
        return asdict(self)


def estimate_training_memory_bytes(num_params: int, dtype_bytes: int) -> int:
    """Weights + gradients + AdamW states + the activation margin (module docstring)."""
    static = num_params * (2 * dtype_bytes + ADAMW_STATE_BYTES_PER_PARAM)
    return int(static * (1.0 + ACTIVATION_MARGIN_FRACTION))


def inspect_model_dir(path: str | Path, *, dtype: str = "auto",
                      device: str = "cpu") -> ModelInfo:
    """Describe the model in ``path`` without loading its weights.

    Raises:
        InvalidArgument("model.path", ...): missing or not a directory, no config.json,
            no weights, an architecture transformers cannot load, no tokenizer files.
    """
    folder = _check_folder(Path(path))
    config = _load_config(folder)
    architecture = _causal_lm_architecture(config)
    num_params = _count_params(config)
    tokenizer = _load_tokenizer(folder)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    renders_tools, template_error = _probe_template(tokenizer) if has_template else (False, "")
    dtype_bytes = torch.finfo(resolve_dtype(dtype, device)).bits // 8
    text = config.get_text_config()
    return ModelInfo(
        path=str(folder), architecture=architecture, model_type=config.model_type,
        num_params=num_params, dtype=str(resolve_dtype(dtype, device)).removeprefix("torch."),
        param_bytes=num_params * dtype_bytes,
        training_memory_bytes=estimate_training_memory_bytes(num_params, dtype_bytes),
        has_chat_template=has_template, template_renders_tools=renders_tools,
        template_error=template_error,
        max_position_embeddings=int(getattr(text, "max_position_embeddings", 0) or 0),
        eos_token_ids=_eos_token_ids(folder, config, tokenizer),
        tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)))


def _check_folder(folder: Path) -> Path:
    if not folder.exists():
        raise InvalidArgument(FIELD, f"{folder} does not exist")
    if not folder.is_dir():
        raise InvalidArgument(FIELD, f"{folder} is not a directory (a Hugging Face model "
                              "directory: config.json, *.safetensors, tokenizer files)")
    if not (folder / "config.json").is_file():
        raise InvalidArgument(FIELD, f"{folder} has no config.json (not a Hugging Face model "
                              "directory; `libra model import` makes one from a GGUF file)")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise InvalidArgument(FIELD, f"{folder} has no weights (none of "
                              f"{', '.join(WEIGHT_FILES)})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise InvalidArgument(FIELD, f"{folder} has no tokenizer files (none of "
                              f"{', '.join(TOKENIZER_FILES)})")
    return folder.resolve()


def _load_config(folder: Path) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        raw = _raw_config(folder)
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if model_type is not None:
            reason = (f"config.json model_type {model_type!r} is not an architecture "
                      f"transformers {transformers.__version__} knows")
        else:
            reason = f"config.json cannot be read: {str(exc).splitlines()[0]}"
        raise InvalidArgument(FIELD, reason) from exc


def _raw_config(folder: Path) -> Any:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def _causal_lm_architecture(config: PretrainedConfig) -> str:
    """The class AutoModelForCausalLM loads (what the trainer and rollout engine use)."""
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise InvalidArgument(FIELD, f"model_type {config.model_type!r} has no causal LM in "
                              f"transformers {transformers.__version__} "
                              "(AutoModelForCausalLM cannot load it)")
    for name in config.architectures or []:
        if not hasattr(transformers, name):
            raise InvalidArgument(FIELD, f"config.json architectures names {name!r}, which "
                                  f"transformers {transformers.__version__} does not have "
                                  "(models with custom code are not supported)")
    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)].__name__


def _count_params(config: PretrainedConfig) -> int:
    """Parameters of the model the config describes; tied tensors count once."""
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # a config transformers accepts but cannot build from
        raise InvalidArgument(FIELD, f"cannot build {config.model_type!r} from config.json: "
                              f"{exc}") from exc
    return sum(p.numel() for p in model.parameters())


def _load_tokenizer(folder: Path) -> Any:
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError, TypeError) as exc:
        raise InvalidArgument(FIELD, f"the tokenizer in {folder} cannot be loaded: "
                              f"{str(exc).splitlines()[0]}") from exc


def _probe_template(tokenizer: Any) -> tuple[bool, str]:
    """(renders tools, error): render a probe conversation with and without ``tools=``."""
    try:
        plain = tokenizer.apply_chat_template(_PROBE_MESSAGES, tokenize=False,
                                              add_generation_prompt=True)
        with_tools = tokenizer.apply_chat_template(_PROBE_MESSAGES, tools=_PROBE_TOOLS,
                                                   tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja raises anything the template author raised
        return False, f"{type(exc).__name__}: {exc}"
    return with_tools != plain and _PROBE_TOOL in with_tools, ""


def _eos_token_ids(folder: Path, config: PretrainedConfig, tokenizer: Any) -> list[int]:
    """generation_config.json's eos ids (what ``generate`` stops on), then the config's
    and the tokenizer's, de-duplicated."""
    ids: list[Any] = []
    generation = _raw_json(folder / "generation_config.json")
    for value in (generation.get("eos_token_id"), config.get_text_config().eos_token_id,
                  tokenizer.eos_token_id):
        ids.extend(value if isinstance(value, list) else [value])
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def _raw_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# -- job checks -------------------------------------------------------------------------


def dtype_problem(dtype: str, device: str, has_native_bf16: bool) -> str | None:
    """Why ``dtype`` cannot train on ``device``, or None.

    bfloat16 on a CPU is accepted: torch computes it on any x86/ARM CPU (fast with
    AVX512-BF16/AMX, slower without, never wrong). On CUDA it needs native support
    (compute capability >= 8.0); ``auto`` picks bfloat16 on CUDA, so it is checked too.
    Gradient checkpointing works with either dtype.
    """
    if not device.startswith("cuda") or has_native_bf16:
        return None
    if resolve_dtype(dtype, device) == torch.bfloat16:
        picked = "bfloat16" if dtype == "bfloat16" else "auto (bfloat16 on CUDA)"
        return (f"{picked} needs a GPU with native bfloat16 (compute capability >= 8.0); "
                "set model.dtype = \"float32\"")
    return None


def machine_memory(device: str) -> tuple[int, str]:
    """(bytes, what) of the memory training would live in: the GPU's, or total RAM."""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return int(props.total_memory), f"GPU memory ({props.name})"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"


def validate_model_for_job(spec: JobSpec, *, device: str | None = None,
                           memory_bytes: int | None = None) -> ModelInfo | None:
    """Check that this machine can train ``spec``'s model; None for the built-in model.

    Args:
        spec: A parsed (already schema-validated) job spec.
        device: Where training would run (default: CUDA when visible, else CPU).
        memory_bytes: The memory budget (default: that device's total memory).

    Raises:
        InvalidArgument: naming ``model.path``, ``model.dtype``, ``model.tool_template``
            or ``model.max_context_tokens`` (docs/models.md lists each check).
    """
    if spec.model.kind != "hf":
        return None
    device = device or default_device()
    info = inspect_model_dir(spec.model.path, dtype=spec.model.dtype, device=device)
    native_bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported(
        including_emulation=False)
    if (problem := dtype_problem(spec.model.dtype, device, native_bf16)) is not None:
        raise InvalidArgument("model.dtype", problem)
    _check_chat(spec, info)
    _check_context(spec, info)
    _check_memory(info, device, memory_bytes)
    return info


def _check_chat(spec: JobSpec, info: ModelInfo) -> None:
    if spec.task.tool_call_format != "hermes":
        return
    if not info.has_chat_template:
        raise InvalidArgument(FIELD, f"the tokenizer in {info.path} has no chat template, "
                              "which task.tool_call_format = \"hermes\" needs")
    if info.template_error:
        raise InvalidArgument(FIELD, f"the chat template in {info.path} fails on a probe "
                              f"conversation: {info.template_error}")
    if spec.model.tool_template == "model" and not info.template_renders_tools:
        raise InvalidArgument("model.tool_template", "\"model\" needs a chat template that "
                              f"renders tools=, and the one in {info.path} ignores them; "
                              "use \"auto\" or \"hermes\"")


def _check_context(spec: JobSpec, info: ModelInfo) -> None:
    limit = info.max_position_embeddings
    if limit and spec.model.max_context_tokens > limit:
        raise InvalidArgument("model.max_context_tokens", f"{spec.model.max_context_tokens} "
                              f"exceeds the model's max_position_embeddings ({limit})")


def _check_memory(info: ModelInfo, device: str, memory_bytes: int | None) -> None:
    available, what = machine_memory(device)
    if memory_bytes is not None:
        available, what = memory_bytes, "memory budget"
    if info.training_memory_bytes > available:
        gib = 2**30
        raise InvalidArgument(FIELD, (
            f"{info.architecture} with {info.num_params / 1e6:,.1f}M parameters needs about "
            f"{info.training_memory_bytes / gib:.1f} GiB to train in {info.dtype} (weights, "
            f"gradients, AdamW states, {ACTIVATION_MARGIN_FRACTION:.0%} activation margin) "
            f"but this machine has {available / gib:.1f} GiB of {what}"))
