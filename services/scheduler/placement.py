"""Placement of queued trajectories with the job's policy, within one pass (pure)."""

from __future__ import annotations

import logging

from libra import types as t
from scheduling.policy.base import TrajectoryDescriptor
from scheduling.policy.thresholds import idle_while_queued
from services.scheduler.job_run import JobRun, apply_local_load

logger = logging.getLogger("services.scheduler.core")


def assign(run: JobRun, trajs: list[t.Trajectory], instances: list[t.InstanceLoad],
           limit: int | None = None) -> list[t.Trajectory]:
    """Ask the policy for a place for each (by priority, re-queued first), the first
    ``limit`` of that order at most; returns the placed ones with ``instance_id``/
    ``bucket`` set. Loads in ``instances`` are bumped so per-instance caps hold within
    the pass without re-reading Redis."""
    order = sorted(trajs, key=lambda tr: (-run.policy.priority(tr.trajectory_id),
                                          tr.attempt == 0))
    placed = []
    for traj in order[:limit]:
        placement = run.policy.begin(TrajectoryDescriptor(
            traj.trajectory_id, traj.prompt_id, traj.group_id, len(traj.prompt_text)),
            instances)
        if not placement.is_placed:
            continue
        traj.instance_id = placement.instance_id
        traj.bucket = placement.bucket or ""
        placed.append(traj)
        apply_local_load(run, ((placement.instance_id, 1),))
    return placed


def check_idle(run: JobRun) -> None:
    """Warn (once per change) about live instances holding nothing while work waits:
    the policy or its caps cannot reach them (e.g. a bucket the layout lacks)."""
    idle = tuple(idle_while_queued(run.instances, len(run.pending or {})))
    if idle != run.idle_while_queued and idle:
        logger.warning("[placement] instances idle while %d trajectories wait job_id=%s "
                       "instances=%s (bucket unknown to the layout, or a cap of 0?)",
                       len(run.pending or {}), run.job_id, ",".join(idle))
    run.idle_while_queued = idle
