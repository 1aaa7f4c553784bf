"""Prometheus view of the training steps the coordinator stores (names in libra/metrics.py).

The servicer calls :func:`export_step` after the core stored a new record (a repeated
report, a trainer retrying after a lost reply, is not counted twice). Gauges hold the
last step; counters and histograms accumulate, so a dashboard takes rates and averages
over any window. Labels are the job id and fixed sets (phase, reason, bucket names of
the job's layout, worker state): never a trajectory id. :class:`QueueCollector` exports
the job queue's length (jobs pending admission) read from the core at scrape time.
:func:`export_plan` counts the elastic planner's decisions; :func:`prune_ended_jobs`
removes a job's series once its run folder is gone (``libra gc`` or retention), so the
process does not export deleted jobs for the rest of its life.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from libra import metrics
from libra import types as t
from libra.bottleneck import phase_seconds  # one definition of the phases, shared with /ui
from libra.cancellation import raise_if_cancelled

logger = logging.getLogger(__name__)
# How often the series of deleted jobs are looked for: a `libra gc` shows on the
# dashboards within a minute, and one pass is a job listing plus a stat per job.
SERIES_PRUNE_INTERVAL_S = 60.0


def export_step(job_id: str, record: t.StepRecord) -> None:
    """Set and count the series of one new step of ``job_id``."""
    metrics.counter("libra_job_steps_total").labels(job_id).inc()
    metrics.gauge("libra_job_step").labels(job_id).set(record.step)
    if record.policy_version is not None:
        metrics.gauge("libra_job_policy_version").labels(job_id).set(record.policy_version)
    if record.reward_mean is not None:
        metrics.gauge("libra_job_reward_mean").labels(job_id).set(record.reward_mean)
    phases = metrics.histogram("libra_job_step_phase_seconds")
    for phase, seconds in phase_seconds(record).items():
        phases.labels(job_id, phase).observe(seconds)
    if record.wall_s is not None:
        metrics.histogram("libra_job_step_wall_seconds").labels(job_id).observe(record.wall_s)
    if record.num_trajectories:
        metrics.counter("libra_job_trajectories_trained_total").labels(job_id).inc(
            record.num_trajectories)
        if record.tokens_mean is not None:
            metrics.counter("libra_job_tokens_trained_total").labels(job_id).inc(
                record.num_trajectories * record.tokens_mean)
    dropped = metrics.counter("libra_job_dropped_total")
    for reason, count in (("stale", record.dropped_stale), ("failed", record.dropped_failed)):
        # The child exists from the first step, so rate() sees a zero before a drop.
        dropped.labels(job_id, reason).inc(count or 0)
    if record.migrations is not None:
        metrics.counter("libra_job_migrations_total").labels(job_id).inc(record.migrations)
    placements = metrics.counter("libra_job_bucket_placements_total")
    for bucket, count in (record.bucket_occupancy or {}).items():
        placements.labels(job_id, bucket).inc(count)
    workers = metrics.gauge("libra_job_hybrid_workers")
    if record.hybrid_workers is not None:
        workers.labels(job_id, "training").set(record.hybrid_workers)
    if record.hybrid_joining is not None:
        workers.labels(job_id, "joining").set(record.hybrid_joining)


def planner_decision(decision: dict[str, Any]) -> tuple[str, str]:
    """(decision, elastic action) of one planner event (libra.metrics.PLANNER_DECISIONS,
    ELASTIC_ACTIONS): bounded label values whatever the planner put in the event."""
    if decision.get("applied"):
        kind = "applied"
    elif decision.get("fired", True):
        kind = "held"
    else:
        kind = "not_fired"
    elastic = decision.get("elastic")
    action = elastic.get("action", "none") if isinstance(elastic, dict) else "none"
    return kind, action if action in metrics.ELASTIC_ACTIONS else "none"


def export_plan(job_id: str, decision: dict[str, Any]) -> None:
    """Count one planner pass of ``job_id`` and set its predicted net gain."""
    kind, action = planner_decision(decision)
    metrics.counter("libra_job_planner_decisions_total").labels(job_id, kind, action).inc()
    gain_s = decision.get("net_gain_s")
    if isinstance(gain_s, int | float):
        metrics.gauge("libra_job_planner_predicted_gain_seconds").labels(job_id).set(gain_s)


async def prune_ended_jobs(list_jobs: Callable[[], Awaitable[list[t.Job]]]) -> list[str]:
    """Remove the series of every exported job that is gone: not in the store any more,
    or ended with its run folder deleted. A running or queued job keeps its series even
    before its folder exists. Returns the job ids removed."""
    if not metrics.jobs_exported():
        return []  # nothing to look up: no job listing
    jobs = {job.job_id: job for job in await list_jobs()}

    async def is_gone(job_id: str) -> bool:
        job = jobs.get(job_id)
        return job is None or (job.state.is_terminal and not Path(job.run_dir).exists())

    gone = await metrics.prune_jobs(is_gone)
    for job_id in gone:
        logger.info("[metrics] series removed job_id=%s (run folder gone)", job_id)
    return gone


async def run_series_pruning(list_jobs: Callable[[], Awaitable[list[t.Job]]],
                             interval_s: float = SERIES_PRUNE_INTERVAL_S) -> None:
    """Forever: a pruning pass, then ``interval_s`` of sleep (cancelled at shutdown)."""
    while True:
        raise_if_cancelled()
        await asyncio.sleep(interval_s)
        try:
            await prune_ended_jobs(list_jobs)
        except Exception:  # noqa: BLE001 - the next pass retries; the service stays up
            logger.warning("[metrics] series pruning failed; next in %.0f s", interval_s,
                           exc_info=True)


class _Queue(Protocol):
    @property
    def num_queued_jobs(self) -> int: ...


class QueueCollector(Collector):
    """``libra_coordinator_queued_jobs``: jobs waiting for their turn to start."""

    def __init__(self, core: _Queue) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily]:
        d = metrics.definition("libra_coordinator_queued_jobs")
        family = GaugeMetricFamily(d.name, d.help, labels=list(d.labels))
        family.add_metric([], self._core.num_queued_jobs)
        yield family


_registered: QueueCollector | None = None


def register(core: _Queue) -> None:
    """Expose the core's job queue on the process's /metrics endpoint (the latest
    core's, when a process serves more than one in turn)."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = QueueCollector(core)
    REGISTRY.register(_registered)
