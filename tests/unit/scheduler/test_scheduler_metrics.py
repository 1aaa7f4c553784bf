"""The scheduler's /metrics view of a job after real ticks: queue depth, groups drawn,
live bucket occupancy (SchedulerCore on the in-memory store, the collector in a
prometheus-client registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.scheduler.memory_store import MemorySchedulerStore
from services.scheduler.metrics import SchedulerCollector
from tests.unit.scheduler.test_scheduler_core import (
    JOB,
    add_instance,
    make_spec,
    started,
)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_queue_depth_and_bucket_occupancy_follow_the_ticks() -> None:
    store = MemorySchedulerStore()
    await add_instance(store, "rollout-0", "short")
    core = await started(store, make_spec(prompts=2, samples=2, cap=1))
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(core))
    await core._tick(core._jobs[JOB])
    got = _samples(registry)
    job = frozenset({("job", JOB)})
    # One slot in 'short', no live 'long' instance: one placed, the rest queued.
    assert got[("libra_scheduler_bucket_trajectories",
                frozenset({("job", JOB), ("bucket", "short")}))] == 1
    assert got[("libra_scheduler_queued_trajectories", job)] == len(await store.pending(JOB))
    assert got[("libra_scheduler_queued_trajectories", job)] >= 1
    assert got[("libra_scheduler_groups_drawn_total", job)] >= 1
    assert got[("libra_scheduler_migrations_total", job)] == 0


async def test_a_stopped_job_leaves_the_scrape() -> None:
    store = MemorySchedulerStore()
    core = await started(store, make_spec())
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(core))
    assert ("libra_scheduler_queued_trajectories", frozenset({("job", JOB)})) in \
        _samples(registry)
    await core.stop_job(JOB)
    assert not any(dict(labels).get("job") == JOB for _name, labels in _samples(registry))
