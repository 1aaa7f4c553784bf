"""What a resume needs to know before it changes anything: the newest checkpoint's step.

The trainer writes ``<run_dir>/checkpoints/step_NNNNNN/meta.json`` last, inside a hidden
temporary folder renamed into place (services/trainer/checkpoint.py), so a folder with a
readable ``meta.json`` is a complete checkpoint. The trainer verifies every file's sha256
when it loads one; this probe only answers "is there one, of which step" at submit time
(file reads only: services never import each other).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

CHECKPOINTS_DIR = "checkpoints"


class CheckpointProbe(Protocol):
    """The step of the newest checkpoint under a run folder, None when there is none
    (blocking: it reads files)."""

    def __call__(self, run_dir: str) -> int | None: ...


_PREFIX = "step_"


def newest_checkpoint_step(run_dir: str) -> int | None:
    """The step of the newest complete checkpoint under ``run_dir``; None when none."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return None
    for folder in sorted((p for p in root.iterdir()
                          if p.is_dir() and p.name.startswith(_PREFIX)), reverse=True):
        try:
            return int(json.loads((folder / "meta.json").read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: an older one may still serve
    return None
