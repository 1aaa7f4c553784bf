"""A job's run directory on disk: its layout, its size, and pruning of published weights.

Layout (``<run_root>/<job_id>/``): ``weights/vNNNNNN.safetensors`` (+ ``.manifest.json``)
published policy versions, ``checkpoints/step_NNNNNN/`` trainer checkpoints, ``model/``
the job's model directory (config, tokenizer) that engines load, plus small files
(``report.json``, ``reward_curve.png``, ``elastic/``). Pure file I/O (os, re): the
trainer core prunes with it, the CLI measures the size for report.json.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from libra.weight_sync import MANIFEST_SUFFIX

WEIGHTS_DIR = "weights"
CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"
# The parts report.json names; everything else under the run dir counts as ``other``.
PARTS = (WEIGHTS_DIR, CHECKPOINTS_DIR, MODEL_DIR)
_VERSION_FILE = re.compile(r"v(\d+)\.safetensors")


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
