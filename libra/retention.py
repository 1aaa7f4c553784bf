"""Run retention: which run folders under the run root may go, and which weight versions.

Used by ``libra gc`` (libra_cli/gc.py) and the coordinator's retention loop
(services/coordinator/retention.py). Both give the same inputs: the folders found under
the run root (:func:`scan_run_root`) and the jobs the coordinator knows. The decision
(:func:`plan_gc`) is pure; :func:`apply_gc` does the deleting (os, shutil only).

Rules, in order (the first that matches decides):

1. A folder whose job is not terminal (PENDING, RUNNING) is kept: it is queued or
   working, and a RUNNING job found at stack start-up is resumed from its checkpoint.
2. The newest ``keep_last`` ended runs are kept, however old.
3. An ended run older than ``max_age_s`` is deleted (``max_age_s`` <= 0: never by age
   in the coordinator's loop; ``libra gc --older-than 0`` means every ended run).
4. Every other ended run is kept, but its weight versions are pruned to the newest
   ``keep_weight_versions`` (0: all kept). Nobody loads an ended job's older versions,
   and a resume restarts from the checkpoint's own weights (checkpoints/), not weights/.

A folder the coordinator does not know (its Redis keys expired 7 days after the end, or
Redis was wiped) counts as ended when its newest file changed. Only folders named like a
job id are considered; ``.libra`` (stack state, logs, Redis) and anything else is left
alone, and symlinks are never followed.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from libra.run_dir import prune_weight_versions, published_versions, tree_bytes, versions_to_prune
from libra.types import Job

# libra/ids.py new_job_id: a slug of 1-24 word characters or "-", "-", 8 hex digits.
_JOB_FOLDER = re.compile(r"[\w-]{1,24}-[0-9a-f]{8}")

DELETE = "delete"
PRUNE_WEIGHTS = "prune_weights"
KEEP = "keep"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What to keep (see the module docstring for the rules)."""

    max_age_s: float
    """Ended runs older than this are deleted; <= 0 deletes none by age unless
    ``delete_all_ended`` (``libra gc --older-than 0``)."""
    keep_last: int = 5
    """The newest ended runs kept whatever their age."""
    keep_weight_versions: int = 1
    """Weight versions kept in a kept ended run (newest first); 0 keeps all."""
    delete_all_ended: bool = False
    """Every ended run beyond ``keep_last`` is deleted, whatever its age."""

    def __post_init__(self) -> None:
        if self.keep_last < 0:
            raise ValueError(f"keep_last must be >= 0, got {self.keep_last}")
        if self.keep_weight_versions < 0:
            raise ValueError(f"keep_weight_versions must be >= 0, got "
                             f"{self.keep_weight_versions}")


@dataclass(frozen=True, slots=True)
class RunFolder:
    """A job-shaped folder under the run root."""

    job_id: str
    path: Path
    modified_ms: int
    """When its newest direct entry changed (the end time of an unknown job)."""


@dataclass(frozen=True, slots=True)
class GcAction:
    """What happens to one run folder, and why."""

    job_id: str
    path: Path
    action: str
    """``delete``, ``prune_weights`` or ``keep``."""
    reason: str
    state: str
    """The job's state, or ``unknown`` when the coordinator has no record of it."""
    ended_ms: int = 0
    prune_versions: list[int] = field(default_factory=list)
    """For ``prune_weights``: the versions to delete, oldest first."""


def scan_run_root(run_root: Path) -> list[RunFolder]:
    """The folders under ``run_root`` named like a job id (symlinks skipped)."""
    if not run_root.is_dir():
        return []
    found = []
    for entry in sorted(run_root.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or not _JOB_FOLDER.fullmatch(entry.name):
            continue
        found.append(RunFolder(entry.name, entry, _newest_mtime_ms(entry)))
    return found


def _newest_mtime_ms(folder: Path) -> int:
    """The newest mtime of the folder and its direct entries (the trainer writes weights/
    and checkpoints/ during a run, report.json at its end): cheap, no deep walk."""
    newest = folder.lstat().st_mtime
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except FileNotFoundError:  # removed while we looked
                continue
    return int(newest * 1000)


def plan_gc(folders: Sequence[RunFolder], jobs: Iterable[Job], policy: RetentionPolicy,
            now_ms: int) -> list[GcAction]:
    """One action per folder, in folder order (pure: reads no file).

    ``jobs`` must be listed after ``folders`` were scanned, so a job created in between
    is known (its folder, if any, is then not taken for an unknown one).
    """
    by_id = {job.job_id: job for job in jobs}
    ended: list[tuple[int, RunFolder, str]] = []
    decided: dict[str, GcAction] = {}
    for folder in folders:
        job = by_id.get(folder.job_id)
        if job is not None and not job.state.is_terminal:
            decided[folder.job_id] = GcAction(folder.job_id, folder.path, KEEP,
                                              f"job is {job.state.value}", job.state.value)
            continue
        ended_ms = job.updated_at_ms if job is not None else folder.modified_ms
        ended.append((ended_ms, folder, job.state.value if job is not None else "unknown"))
    ended.sort(key=lambda item: item[0], reverse=True)  # newest first
    for rank, (ended_ms, folder, state) in enumerate(ended):
        decided[folder.job_id] = _ended_action(folder, state, ended_ms, rank, policy, now_ms)
    return [decided[folder.job_id] for folder in folders]


def _ended_action(folder: RunFolder, state: str, ended_ms: int, rank: int,
                  policy: RetentionPolicy, now_ms: int) -> GcAction:
    age_s = (now_ms - ended_ms) / 1000
    if rank < policy.keep_last:
        reason = f"among the newest {policy.keep_last} ended runs"
    elif policy.delete_all_ended or 0 < policy.max_age_s < age_s:
        return GcAction(folder.job_id, folder.path, DELETE,
                        f"ended {_age_text(age_s)} ago", state, ended_ms)
    else:
        reason = f"ended {_age_text(age_s)} ago, within the age limit"
    return GcAction(folder.job_id, folder.path, KEEP, reason, state, ended_ms)


def _age_text(age_s: float) -> str:
    if age_s >= 2 * 86400:
        return f"{age_s / 86400:.1f} d"
    if age_s >= 2 * 3600:
        return f"{age_s / 3600:.1f} h"
    return f"{max(age_s, 0) / 60:.0f} min"


def with_weight_pruning(actions: Sequence[GcAction], keep_weight_versions: int) -> list[GcAction]:
    """Kept ended runs with more than ``keep_weight_versions`` weight versions become
    ``prune_weights`` (reads each kept ended run's weights/ folder)."""
    if keep_weight_versions <= 0:
        return list(actions)
    out = []
    for act in actions:
        if act.action == KEEP and act.ended_ms:
            extra = versions_to_prune(published_versions(act.path), keep_weight_versions, ())
            if extra:
                act = GcAction(act.job_id, act.path, PRUNE_WEIGHTS,
                               f"{act.reason}; keeps the newest {keep_weight_versions} "
                               "weight version(s)", act.state, act.ended_ms, extra)
        out.append(act)
    return out


def action_bytes(act: GcAction) -> int:
    """Bytes ``act`` frees: the whole folder, the pruned weights, or nothing."""
    if act.action == DELETE:
        return tree_bytes(act.path)
    if act.action == PRUNE_WEIGHTS:
        versions = published_versions(act.path)
        return sum(tree_bytes(versions[v]) for v in act.prune_versions if v in versions)
    return 0


def apply_gc(actions: Iterable[GcAction], run_root: Path) -> int:
    """Carry out ``delete`` and ``prune_weights``; returns how many folders changed.

    A path outside ``run_root`` (or a symlink) is never touched: the plan came from
    :func:`scan_run_root` of the same root, so this is a guard, not a rule.
    """
    root = run_root.resolve()
    changed = 0
    for act in actions:
        if act.action == KEEP or act.path.is_symlink() or act.path.resolve().parent != root:
            continue
        if act.action == DELETE:
            shutil.rmtree(act.path, ignore_errors=True)
        else:  # exactly the planned versions: every other one counts as in use
            others = set(published_versions(act.path)) - set(act.prune_versions)
            prune_weight_versions(act.path, keep=1, in_use=others)
        changed += 1
    return changed
