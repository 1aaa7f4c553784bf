"""Identifier builders: one place decides what an id looks like."""

from __future__ import annotations

import uuid

from libra.types import GroupId, JobId, TrajectoryId


def new_job_id(name: str) -> JobId:
    """A new job id: the name as a slug (at most 24 characters) plus 8 random hex digits."""
    slug = "".join(c if c.isalnum() or c == "-" else "-" for c in name.lower())[:24].strip("-")
    return JobId(f"{slug or 'job'}-{uuid.uuid4().hex[:8]}")


def new_run_token() -> str:
    """Names one run of a job on a trainer (a resume is a new run): part of the
    idempotency key of its step reports, so a redone step is told from a retry."""
    return uuid.uuid4().hex[:8]


def group_id(job_id: str, step_index: int, prompt_id: str) -> GroupId:
    """The group of one prompt admitted at step ``step_index``: the trajectories GRPO
    normalises together."""
    return GroupId(f"{job_id}:g{step_index}:{prompt_id}")


def eval_group_id(job_id: str, eval_round: int, index: int, prompt_id: str) -> GroupId:
    """The group of one held-out prompt in one eval round (libra/evaluation.py)."""
    return GroupId(f"{job_id}:e{eval_round}:{index}:{prompt_id}")


def trajectory_id(group: str, sample_index: int) -> TrajectoryId:
    """Sample ``sample_index`` of ``group``."""
    return TrajectoryId(f"{group}:s{sample_index}")
