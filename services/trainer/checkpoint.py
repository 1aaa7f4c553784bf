"""Trainer checkpoints on disk: atomic write, keep-last-N, verified load (pure file I/O).

Layout: ``<run_dir>/checkpoints/step_NNNNNN/`` holds the backend's files (model,
optimizer, RNG; written by ``Backend.save_checkpoint``) plus ``meta.json`` with the step,
the policy version and the sha256 of every backend file. A checkpoint is written into a
hidden ``.step_NNNNNN.tmp`` folder and renamed into place, so a crash mid-write leaves no
half checkpoint behind; :func:`latest` verifies every file before the trainer trusts it.

What is *not* here, because Redis already holds it durably (AOF): the trajectory
stream's consumer-group position (pending entries are re-delivered after a restart), the
idempotency set of consumed trajectory ids and the admission counters.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The format (and its verification) lives in libra/run_dir.py: the coordinator checks
# ``algorithm.init_from`` with it and services never import each other.
from libra.run_dir import CHECKPOINT_META as META
from libra.run_dir import CHECKPOINT_PREFIX as _PREFIX
from libra.run_dir import Checkpoint, CheckpointError, checkpoint_folders, latest_checkpoint
from libra.weight_sync import sha256_file

__all__ = ["META", "Checkpoint", "CheckpointError", "latest", "save"]


def save(root: Path, step: int, policy_version: int, write: Callable[[str], list[str]],
         keep: int = 2, step_report: dict[str, Any] | None = None) -> Checkpoint:
    """Write a checkpoint of ``step`` atomically and prune all but the newest ``keep``.

    Args:
        root: The checkpoints folder (created if missing).
        step: Completed training steps.
        policy_version: Version published with these weights.
        write: Writes the backend's files into the folder it is given; returns their names.
        keep: Checkpoints to keep (the newest).
        step_report: The step's report (JSON-able), returned again by :func:`latest`.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:06d}"
    tmp = root / f".{_PREFIX}{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    names = write(str(tmp))
    meta = {"step": step, "policy_version": policy_version,
            "files": {name: sha256_file(tmp / name) for name in names},
            "step_report": step_report}
    (tmp / META).write_text(json.dumps(meta, indent=1))
    # A step redone after a resume replaces the checkpoint of the same step.
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    for old in checkpoint_folders(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return Checkpoint(final, step, policy_version, step_report)


def latest(root: Path) -> Checkpoint | None:
    """The newest checkpoint under ``root``, verified; None when there is none.

    Raises:
        CheckpointError: Its ``meta.json`` is unreadable or a file is missing or does not
            match its recorded sha256. The message names the file.
    """
    return latest_checkpoint(root)
