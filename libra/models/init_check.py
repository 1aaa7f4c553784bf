"""``algorithm.init_from`` at submit: does the named checkpoint fit the job's ``[model]``?

The checkpoint is resolved and verified (sha256 of every file, libra/run_dir.py), then
its model file's tensor names and shapes, read from the safetensors header alone (no
weights in memory), are compared with those of the job's model built on the meta
device (no memory either), in the published convention: tied aliases left out. When
the checkpoint sits in a job's run dir, that job's ``model/config.json`` also gives its
architecture, compared first. torch and transformers load lazily (the coordinator
imports this only for a job with ``init_from``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from libra.errors import InvalidArgument
from libra.jobspec import JobSpec
from libra.run_dir import CHECKPOINT_MODEL, INIT_FROM, MODEL_DIR, Checkpoint, resolve_init_from

Shapes = dict[str, tuple[int, ...]]
_SHOWN = 3  # differences named per kind in the error
_MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit


def safetensors_shapes(path: Path) -> Shapes:
    """Tensor name -> shape from a safetensors file's header; the data is not read.

    Raises:
        ValueError: Not a safetensors file (unreadable, truncated or a bad header).
    """
    try:
        with path.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            # A garbage length must not become a huge read (safetensors caps it too).
            if length > min(_MAX_HEADER_BYTES, path.stat().st_size - 8):
                raise ValueError(f"header length {length} does not fit the file")
            header = json.loads(fh.read(length))
        return {name: tuple(entry["shape"]) for name, entry in header.items()
                if name != "__metadata__"}
    except (OSError, struct.error, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is not a readable safetensors file: {exc}") from exc


def shape_differences(have: Shapes, want: Shapes) -> list[str]:
    """What separates a checkpoint's tensors (``have``) from the model's (``want``)."""
    problems = []
    shapes = [f"{name} {have[name]} != {want[name]}" for name in want
              if name in have and have[name] != want[name]]
    missing = [name for name in want if name not in have]
    unexpected = [name for name in have if name not in want]
    for label, names in (("shapes (checkpoint != model)", shapes), ("missing", missing),
                         ("unexpected", unexpected)):
        if names:
            more = f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
            problems.append(f"{label}: {', '.join(names[:_SHOWN])}{more}")
    return problems


def model_shapes(spec: JobSpec) -> tuple[str, Shapes]:
    """(architecture, published tensor shapes) of ``spec``'s model, built on the meta
    device from its config (the built-in tiny Llama or ``model.path``'s config.json)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from libra.models.tiny import TinyModelConfig, build_model
    from libra.training.tensors import without_tied_aliases

    m = spec.model
    with torch.device("meta"):
        if m.kind == "hf":
            config = AutoConfig.from_pretrained(m.path, local_files_only=True)
            model = AutoModelForCausalLM.from_config(config)
        else:
            model = build_model(TinyModelConfig(
                hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                intermediate_size=m.intermediate_size,
                max_context_tokens=m.max_position_embeddings), seed=m.seed)
    state = without_tied_aliases(model, model.state_dict())
    return type(model).__name__, {name: tuple(t.shape) for name, t in state.items()}


def source_architecture(ckpt: Checkpoint) -> str:
    """The architecture of the job that wrote ``ckpt`` (``<run_dir>/model/config.json``
    beside ``checkpoints/``); "" when the checkpoint is not inside a run dir."""
    config = ckpt.path.parent.parent / MODEL_DIR / "config.json"
    try:
        architectures = json.loads(config.read_text()).get("architectures") or [""]
    except (OSError, ValueError, AttributeError):
        return ""
    return str(architectures[0])


def check_init_from(spec: JobSpec, run_root: Path) -> Checkpoint:
    """The checkpoint ``spec.algorithm.init_from`` names, when it fits ``[model]``.

    Raises:
        InvalidArgument: ``algorithm.init_from``: not found, does not verify, not
            readable, or its model differs (architecture, tensor names or shapes; named).
    """
    ckpt = resolve_init_from(spec.algorithm.init_from, run_root)
    try:
        have = safetensors_shapes(ckpt.path / CHECKPOINT_MODEL)
    except ValueError as exc:
        raise InvalidArgument(INIT_FROM, str(exc)) from exc
    architecture, want = model_shapes(spec)
    problems = shape_differences(have, want)
    source = source_architecture(ckpt)
    if source and source != architecture:
        problems.insert(0, f"architecture {source} != {architecture}")
    if problems:
        raise InvalidArgument(INIT_FROM, f"checkpoint {ckpt.path} does not fit [model] "
                              f"(kind {spec.model.kind!r}, {architecture}): "
                              + "; ".join(problems))
    return ckpt
