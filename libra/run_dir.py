"""A job's run directory on disk: its layout, its size, and pruning of published weights.

Layout (``<run_root>/<job_id>/``): ``weights/vNNNNNN.safetensors`` (+ ``.manifest.json``)
published policy versions, ``checkpoints/step_NNNNNN/`` trainer checkpoints, ``model/``
the job's model directory (config, tokenizer) that engines load, plus small files
(``report.json``, ``reward_curve.png``, ``elastic/``). Pure file I/O (os, re): the
trainer core prunes with it, the CLI measures the size for report.json.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra.errors import InvalidArgument
from libra.weight_sync import MANIFEST_SUFFIX, sha256_file

WEIGHTS_DIR = "weights"
CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"
# The parts report.json names; everything else under the run dir counts as ``other``.
PARTS = (WEIGHTS_DIR, CHECKPOINTS_DIR, MODEL_DIR)
_VERSION_FILE = re.compile(r"v(\d+)\.safetensors")
# A checkpoint folder: ``checkpoints/step_NNNNNN/`` with ``meta.json`` (step, policy
# version, sha256 of every file; services/trainer/checkpoint.py writes it).
CHECKPOINT_PREFIX = "step_"
CHECKPOINT_META = "meta.json"
CHECKPOINT_MODEL = "model.safetensors"  # the model weights inside a checkpoint folder


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be trusted; the message names the file."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint folder."""

    path: Path
    step: int
    policy_version: int
    step_report: dict[str, Any] | None = None
    """The step's report to the coordinator (``{"record", "key"}``), kept so a resume
    can send it again: the process may have stopped between this write and the report."""


def weights_file(run_dir: Path, version: int) -> Path:
    """Where the trainer publishes ``version``."""
    return run_dir / WEIGHTS_DIR / f"v{version:06d}.safetensors"


def published_versions(run_dir: Path) -> dict[int, Path]:
    """Version -> weights file under ``run_dir/weights`` (every ``vNNNNNN.safetensors``)."""
    folder = run_dir / WEIGHTS_DIR
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        if match := _VERSION_FILE.fullmatch(path.name):
            found[int(match.group(1))] = path
    return found


def versions_to_prune(published: Iterable[int], keep: int, in_use: Iterable[int]) -> list[int]:
    """The versions that may be deleted, oldest first.

    Kept: the newest ``keep`` (so always the newest; ``keep = 0`` keeps everything) and
    every version in ``in_use`` (loaded or being loaded by a live rollout instance).
    """
    if keep <= 0:
        return []
    ordered = sorted(set(published))
    kept = set(ordered[-keep:]) | set(in_use)
    return [version for version in ordered if version not in kept]


def prune_weight_versions(run_dir: Path, keep: int, in_use: Iterable[int]) -> list[int]:
    """Delete the weights (and manifests) of :func:`versions_to_prune`; returns them.

    The manifest goes first: a manifest is the sign that its weights file is complete,
    so no reader ever finds a manifest whose weights are gone.
    """
    versions = published_versions(run_dir)
    pruned = versions_to_prune(versions, keep, in_use)
    for version in pruned:
        path = versions[version]
        path.with_name(path.name + MANIFEST_SUFFIX).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    return pruned


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks are not followed: a model
    directory linked into the run dir is not the run's storage)."""
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            file = Path(folder) / name
            if not file.is_symlink():
                try:
                    total += file.stat().st_size
                except FileNotFoundError:  # pruned while we walked
                    continue
    return total


def run_dir_usage(run_dir: Path | None) -> dict[str, int]:
    """``report.json``'s ``storage``: bytes in total and per part, and how many weight
    versions are on disk (all zero when the run dir is None or not on this machine)."""
    if run_dir is None:
        return dict.fromkeys(("run_dir_bytes", *(f"{p}_bytes" for p in PARTS), "other_bytes",
                              "num_weight_versions"), 0)
    total = tree_bytes(run_dir)
    parts = {f"{part}_bytes": tree_bytes(run_dir / part) for part in PARTS}
    return {"run_dir_bytes": total, **parts, "other_bytes": total - sum(parts.values()),
            "num_weight_versions": len(published_versions(run_dir))}


# -- checkpoints ----------------------------------------------------------------------------

def checkpoint_folders(root: Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first (temporary ones, written
    as ``.step_NNNNNN.tmp`` and renamed when complete, are ignored)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX))


def verify_checkpoint(folder: Path) -> Checkpoint:
    """Check every file of a checkpoint folder against its ``meta.json``.

    Raises:
        CheckpointError: ``meta.json`` is unreadable or a file is missing or does not
            match its recorded sha256. The message names the file.
    """
    meta_path = folder / CHECKPOINT_META
    try:
        meta = json.loads(meta_path.read_text())
        step, version, files = int(meta["step"]), int(meta["policy_version"]), meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"corrupt checkpoint file {meta_path}: {exc}") from exc
    for name, digest in files.items():
        path = folder / name
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise CheckpointError(f"corrupt checkpoint file {path}: {exc}") from exc
        if actual != digest:
            raise CheckpointError(f"corrupt checkpoint file {path}: sha256 {actual} does not "
                                  f"match {digest} recorded in {meta_path}")
    return Checkpoint(folder, step, version, meta.get("step_report"))


def latest_checkpoint(root: Path) -> Checkpoint | None:
    """The newest checkpoint under ``root``, verified; None when there is none.

    Raises:
        CheckpointError: The newest one cannot be trusted (see :func:`verify_checkpoint`).
    """
    folders = checkpoint_folders(root)
    return verify_checkpoint(folders[-1]) if folders else None


# -- algorithm.init_from --------------------------------------------------------------------

INIT_FROM = "algorithm.init_from"


def is_dir_reference(value: str) -> bool:
    """``init_from`` names a directory when it contains "/" or starts with "~" or ".";
    otherwise it is a job id (a folder name under the run root)."""
    return "/" in value or value.startswith(("~", "."))


def resolve_init_from(value: str, run_root: Path) -> Checkpoint:
    """The verified checkpoint ``algorithm.init_from`` names.

    A job id is that job's run dir under ``run_root``; a run dir gives its newest
    checkpoint; a checkpoint folder (with ``meta.json``) is taken as is.

    Raises:
        InvalidArgument: ``algorithm.init_from``: no such job or directory, no checkpoint
            in it, or the checkpoint does not verify (the message names the file).
    """
    if is_dir_reference(value):
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise InvalidArgument(INIT_FROM, f"{folder} is not a directory")
    else:
        folder = run_root / value
        if not folder.is_dir():
            raise InvalidArgument(INIT_FROM, f"no job {value!r}: {folder} does not exist "
                                  "(a directory needs a '/' in its path)")
    try:
        if (folder / CHECKPOINT_META).is_file():
            return verify_checkpoint(folder)
        if not (folder / CHECKPOINTS_DIR).is_dir():
            raise InvalidArgument(INIT_FROM, f"{folder} is neither a checkpoint folder "
                                  f"({CHECKPOINT_META}) nor a job's run dir ({CHECKPOINTS_DIR}/)")
        found = latest_checkpoint(folder / CHECKPOINTS_DIR)
    except CheckpointError as exc:
        raise InvalidArgument(INIT_FROM, f"the checkpoint does not verify: {exc}") from exc
    if found is None:
        raise InvalidArgument(INIT_FROM, f"{folder / CHECKPOINTS_DIR} holds no checkpoint "
                              "(the job wrote none: see algorithm.checkpoint_interval)")
    return found
