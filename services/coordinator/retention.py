"""The coordinator's retention loop: ended jobs' run folders and weight versions.

Runs beside reconciliation for the life of the process (services/coordinator/__main__.py).
Each pass lists the folders under ``run_root``, then the jobs (so a job created in
between is known), decides with libra/retention.py and deletes in a thread. A pass that
fails (Redis unreachable, a file error) is logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from libra.cancellation import raise_if_cancelled
from libra.retention import (
    DELETE,
    KEEP,
    PRUNE_WEIGHTS,
    GcAction,
    RetentionPolicy,
    apply_gc,
    plan_gc,
    scan_run_root,
    with_weight_pruning,
)
from libra.types import Job
from services.coordinator.config import RetentionConfig

logger = logging.getLogger(__name__)

# The first pass waits this long after start-up: reconciliation settles jobs found
# RUNNING first, and a stack that starts and stops at once does no disk work.
FIRST_PASS_DELAY_S = 60.0


def policy_of(cfg: RetentionConfig) -> RetentionPolicy:
    return RetentionPolicy(max_age_s=cfg.max_age_days * 86400, keep_last=cfg.keep_last_runs,
                           keep_weight_versions=cfg.ended_weight_versions)


async def retention_pass(list_jobs: Callable[[], Awaitable[list[Job]]], run_root: Path,
                         policy: RetentionPolicy, now_ms: int | None = None) -> list[GcAction]:
    """One pass; returns the actions carried out (deletes and weight prunes)."""
    folders = await asyncio.to_thread(scan_run_root, run_root)
    if not folders:
        return []
    jobs = await list_jobs()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms

    def decide_and_apply() -> list[GcAction]:
        actions = with_weight_pruning(plan_gc(folders, jobs, policy, now_ms),
                                      policy.keep_weight_versions)
        actions = _respect_keep_all(actions, jobs)
        done = [a for a in actions if a.action in (DELETE, PRUNE_WEIGHTS)]
        apply_gc(done, run_root)
        return done

    done = await asyncio.to_thread(decide_and_apply)
    for act in done:
        logger.info("[retention] %s job_id=%s state=%s reason=%s versions=%s", act.action,
                    act.job_id, act.state, act.reason, act.prune_versions or "")
    return done


def _respect_keep_all(actions: list[GcAction], jobs: list[Job]) -> list[GcAction]:
    """A job whose spec asked to keep every weight version (``algorithm.keep_weight_versions
    = 0``) keeps them after its end too; only its folder's age can remove it."""
    keep_all = {job.job_id for job in jobs if _keeps_all_weights(job.spec_json)}
    return [GcAction(a.job_id, a.path, KEEP, a.reason.split(";")[0], a.state, a.ended_ms)
            if a.action == PRUNE_WEIGHTS and a.job_id in keep_all else a for a in actions]


def _keeps_all_weights(spec_json: str) -> bool:
    try:
        algorithm = json.loads(spec_json).get("algorithm", {})
    except (ValueError, AttributeError):
        return False
    return isinstance(algorithm, dict) and algorithm.get("keep_weight_versions") == 0


async def run_retention(list_jobs: Callable[[], Awaitable[list[Job]]], run_root: Path,
                        cfg: RetentionConfig, first_delay_s: float = FIRST_PASS_DELAY_S) -> None:
    """Forever: a pass, then ``cfg.interval_s`` of sleep (cancelled at shutdown)."""
    policy = policy_of(cfg)
    await asyncio.sleep(first_delay_s)
    while True:
        raise_if_cancelled()
        try:
            await retention_pass(list_jobs, run_root, policy)
        except Exception:  # noqa: BLE001 - the next pass retries; the service stays up
            logger.warning("[retention] pass failed; next in %.0f s", cfg.interval_s,
                           exc_info=True)
        await asyncio.sleep(cfg.interval_s)
