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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libra.weight_sync import sha256_file

META = "meta.json"
_PREFIX = "step_"


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
    for old in _folders(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return Checkpoint(final, step, policy_version, step_report)


def latest(root: Path) -> Checkpoint | None:
    """The newest checkpoint under ``root``, verified; None when there is none.

    Raises:
        CheckpointError: Its ``meta.json`` is unreadable or a file is missing or does not
            match its recorded sha256. The message names the file.
    """
    folders = _folders(root)
    if not folders:
        return None
    folder = folders[-1]
    meta_path = folder / META
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


def _folders(root: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (temporary ones are ignored)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))

