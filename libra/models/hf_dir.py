"""Writing Hugging Face model directories: atomically, with tied weights stored once.

Shared by ``libra model import`` (GGUF -> HF) and ``libra export`` (published weights ->
HF). Both produce a directory that ``AutoModelForCausalLM.from_pretrained(DIR)`` loads
offline: ``config.json``, ``model.safetensors``, tokenizer files with the chat template,
``generation_config.json``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from libra.errors import InvalidArgument

WEIGHTS_FILE = "model.safetensors"

# Where import and export report what they are doing (the CLI prints; tests stay quiet).
Progress = Callable[[str], None]


def quiet(_message: str) -> None:
    """A :data:`Progress` that says nothing."""


def check_output_dir(out: Path, *, force: bool, field: str = "--out") -> None:
    """Refuse an output path that is a file, or a non-empty directory without ``force``."""
    if out.exists() and not out.is_dir():
        raise InvalidArgument(field, f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InvalidArgument(field, f"{out} exists and is not empty (pass --force to "
                              "replace it)")


@contextmanager
def atomic_output_dir(out: Path, *, force: bool) -> Iterator[Path]:
    """Yield a fresh temp directory beside ``out``; on success it replaces ``out``.

    The temp directory sits in ``out``'s parent so the final rename stays on one file
    system (atomic). On any error it is removed and ``out`` is left as it was. With
    ``force`` an existing ``out`` is first renamed aside, then deleted after the swap, so
    a reader never sees a half-written directory under ``out``'s name.
    """
    check_output_dir(out, force=force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = out.parent / f".{out.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        yield tmp
        old = out.parent / f".{out.name}.old-{tag}"
        if out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names of parameters that share one tensor (tied), canonical (first) name first.

    Works on a meta-device model too: tying makes the names point at the same Parameter
    object, whatever device it lives on.
    """
    by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(param), []).append(name)
    return [names for names in by_param.values() if len(names) > 1]


def drop_tied_copies(state_dict: Mapping[str, torch.Tensor],
                     groups: list[list[str]]) -> dict[str, torch.Tensor]:
    """Keep one entry per tied group (the canonical name; safetensors refuses shared
    tensors and ``from_pretrained`` re-ties the others)."""
    out = dict(state_dict)
    for names in groups:
        for name in names[1:]:
            out.pop(name, None)
    return out


def save_weights_file(state_dict: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write ``state_dict`` as one safetensors file with the ``format=pt`` metadata
    ``from_pretrained`` expects. Tied copies must be dropped first (:func:`drop_tied_copies`):
    safetensors refuses two names over one storage."""
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state_dict.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    # safetensors creates the file owner-only (0600); a model directory is meant to be
    # read by other users' processes (services, notebooks) like its other files.
    path.chmod(0o644)


def directory_bytes(path: Path) -> int:
    """Total size of the files directly in ``path``."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
