"""``libra export``: a job's published policy version -> a Hugging Face model directory.

The trainer keeps the job's model directory in ``<run_dir>/model`` (config, tokenizer,
chat template) and publishes each policy version as ``<run_dir>/weights/vNNNNNN.safetensors``
(the model's full state dict) with a ``.manifest.json`` beside it (size, sha256, chunks;
libra/weight_sync.py). :func:`export_hf` joins one version's weights with the model
directory's config and tokenizer into a directory ``from_pretrained`` loads offline.

The published state dict is checked against the shapes the config describes (built on
the meta device), so a weights file from another model is refused by name instead of
producing a directory that fails later. Tied weights (``lm_head.weight`` sharing
``model.embed_tokens.weight``) are stored once, whichever of the names the file has.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from libra.errors import InvalidArgument, NotFound
from libra.models.hf_dir import (
    WEIGHTS_FILE,
    Progress,
    atomic_output_dir,
    check_output_dir,
    directory_bytes,
    quiet,
    save_weights_file,
    tied_groups,
)
from libra.run_dir import WEIGHTS_DIR, published_versions
from libra.weight_sync import MANIFEST_SUFFIX

MODEL_DIR = "model"
PROVENANCE_FILE = "libra_export.json"


@dataclass(frozen=True)
class ExportSummary:
    """The result of :func:`export_hf` (``libra export --json`` prints it)."""

    out: str
    model_dir: str
    weights: str
    version: int
    architecture: str
    num_params: int
    dtype: str
    size_bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (``libra model export --json``)."""
        return asdict(self)


def find_weights(run_dir: Path, version: int | None = None) -> tuple[int, Path]:
    """The weights file of ``version``, or of the newest version with a manifest.

    The manifest is written after the weights file is complete, so a newest file without
    one may still be being written; it is skipped unless asked for by number.

    Raises:
        NotFound: No such run directory, no published versions, or no such version.
    """
    if not run_dir.is_dir():
        raise NotFound(f"run directory {run_dir} does not exist")
    versions = published_versions(run_dir)
    if not versions:
        raise NotFound(f"{run_dir / WEIGHTS_DIR} holds no published weights (vNNNNNN.safetensors)")
    if version is not None:
        if version not in versions:
            raise NotFound(f"version {version} is not published in {run_dir / WEIGHTS_DIR} "
                           f"(published: {_ranges(sorted(versions))})")
        return version, versions[version]
    complete = [v for v, p in versions.items() if _manifest_of(p).is_file()]
    newest = max(complete or versions)
    return newest, versions[newest]


def _ranges(numbers: list[int]) -> str:
    return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 3 else ", ".join(map(str, numbers))


def _manifest_of(weights_path: Path) -> Path:
    return weights_path.with_name(weights_path.name + MANIFEST_SUFFIX)


def verify_against_manifest(weights_path: Path) -> bool:
    """Check size and sha256 against the manifest beside the file; False when there is
    none. Raises InvalidArgument("weights", ...) on a mismatch (a damaged file)."""
    manifest_path = _manifest_of(weights_path)
    if not manifest_path.is_file():
        return False
    manifest = json.loads(manifest_path.read_text())
    digest = hashlib.sha256()
    with weights_path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    size = weights_path.stat().st_size
    if size != manifest["size_bytes"] or digest.hexdigest() != manifest["sha256"]:
        raise InvalidArgument("weights", f"{weights_path} does not match its manifest "
                              f"({size} bytes, sha256 {digest.hexdigest()[:12]}...; the "
                              f"manifest says {manifest['size_bytes']} bytes, "
                              f"{manifest['sha256'][:12]}...)")
    return True


def export_hf(model_dir: Path, weights_path: Path, out: Path, *, force: bool = False,
              version: int = -1, progress: Progress = quiet) -> ExportSummary:
    """Write ``model_dir``'s config and tokenizer with ``weights_path``'s tensors to ``out``.

    Raises:
        InvalidArgument: ``model_dir`` has no config.json, the weights file is missing,
            unreadable, damaged or does not fit the config, or ``out`` is not empty and
            ``force`` is False.
    """
    started = time.perf_counter()
    if not (model_dir / "config.json").is_file():
        raise InvalidArgument("--model-dir", f"{model_dir} has no config.json")
    if not weights_path.is_file():
        raise InvalidArgument("weights", f"{weights_path} does not exist")
    check_output_dir(out, force=force)
    if verify_against_manifest(weights_path):
        progress(f"[export] {weights_path.name} matches its manifest")
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    state = _fit_to_config(_load_weights(weights_path), config)
    dtype = next(iter(state.values())).dtype
    with atomic_output_dir(out, force=force) as tmp:
        _write_dir(model_dir, config, state, tmp)
        (tmp / PROVENANCE_FILE).write_text(json.dumps(
            {"weights": str(weights_path.resolve()), "version": version,
             "model_dir": str(model_dir.resolve())}, indent=1))
    summary = ExportSummary(
        out=str(out), model_dir=str(model_dir), weights=str(weights_path), version=version,
        architecture=(config.architectures or [config.model_type])[0],
        num_params=sum(t.numel() for t in state.values()),
        dtype=str(dtype).removeprefix("torch."), size_bytes=directory_bytes(out),
        seconds=round(time.perf_counter() - started, 2))
    progress(f"[export] wrote {out} ({summary.size_bytes / 2**20:.1f} MiB) in "
             f"{summary.seconds:.1f} s")
    return summary


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise InvalidArgument("weights", f"{path} is not a readable safetensors file: "
                              f"{exc}") from exc


def _fit_to_config(published: Mapping[str, torch.Tensor],
                   config: Any) -> dict[str, torch.Tensor]:
    """The published tensors under the names the config's model has, tied ones once.

    Raises InvalidArgument("weights", ...) naming missing, unexpected or misshapen tensors.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = model.state_dict()
    partners = {name: group for group in tied_groups(model) for name in group}
    unexpected = sorted(set(published) - set(expected))
    if unexpected:
        raise InvalidArgument("weights", f"tensors the model has no place for: "
                              f"{', '.join(unexpected[:5])}")
    out: dict[str, torch.Tensor] = {}
    for name, meta in expected.items():
        group = partners.get(name, [name])
        if name != group[0]:
            continue  # a tied copy: stored under the group's canonical name only
        tensor = _tied_value(published, group)
        if tuple(tensor.shape) != tuple(meta.shape):
            raise InvalidArgument("weights", f"{name} has shape {tuple(tensor.shape)}, the "
                                  f"config says {tuple(meta.shape)}")
        out[name] = tensor
    return out


def _tied_value(published: Mapping[str, torch.Tensor], group: list[str]) -> torch.Tensor:
    present = [name for name in group if name in published]
    if not present:
        raise InvalidArgument("weights", f"{group[0]} is missing")
    first = published[present[0]]
    for name in present[1:]:
        if not torch.equal(first, published[name]):
            raise InvalidArgument("weights", f"{present[0]} and {name} are tied in the "
                                  "config but differ in the file")
    return first


def _write_dir(model_dir: Path, config: Any, state: dict[str, torch.Tensor],
               folder: Path) -> None:
    """config.json (dtype of the weights), model.safetensors, tokenizer, generation config."""
    config.dtype = str(next(iter(state.values())).dtype).removeprefix("torch.")
    config.save_pretrained(folder)
    save_weights_file(state, folder / WEIGHTS_FILE)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tokenizer.save_pretrained(folder)
    if (model_dir / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(model_dir, local_files_only=True)
    else:
        generation = GenerationConfig.from_model_config(config)
        if generation.eos_token_id is None and tokenizer.eos_token_id is not None:
            generation.eos_token_id = tokenizer.eos_token_id
    generation.save_pretrained(folder)
