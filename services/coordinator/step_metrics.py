"""Prometheus view of the training steps the coordinator stores (names in libra/metrics.py).

The servicer calls :func:`export_step` after the core stored a new record (a repeated
report, a trainer retrying after a lost reply, is not counted twice). Gauges hold the
last step; counters and histograms accumulate, so a dashboard takes rates and averages
over any window. Labels are the job id and fixed sets (phase, reason, bucket names of
the job's layout, worker state): never a trajectory id. :class:`QueueCollector` exports
the job queue's length (jobs pending admission) read from the core at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from libra import metrics
from libra import types as t
from libra.bottleneck import phase_seconds  # one definition of the phases, shared with /ui


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
