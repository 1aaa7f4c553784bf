"""The scheduler's /metrics view of a job after real ticks: queue depth, groups drawn,
live bucket occupancy (SchedulerCore on the in-memory store, the collector in a
prometheus-client registry)."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from libra.clock import FakeClock
from libra.step_timing import StepTimes
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore
from services.scheduler.metrics import SchedulerCollector, observe_tick
from tests.unit.scheduler.test_scheduler_core import (
    JOB,
    add_instance,
    add_job,
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


async def test_every_tick_reports_its_wall_and_its_own_steps() -> None:
    """``run`` hands each tick's wall time and own steps to the observer: the three
    histograms the scheduler exports (tick, own, CPU) are fed from it, and own time
    never exceeds the wall time it is part of."""
    store = MemorySchedulerStore()
    await add_instance(store, "rollout-0", "short")
    await add_job(store, make_spec(prompts=2, samples=2, cap=1))
    seen: list[tuple[float, StepTimes]] = []
    clock = FakeClock()

    def observe(wall_s: float, own: StepTimes) -> None:
        seen.append((wall_s, own))
        clock.advance(1.0)  # the next tick reads a new lease snapshot
        if len(seen) == 3:
            asyncio.get_running_loop().create_task(core.drain(0.0))

    core = SchedulerCore(store, clock, tick_s=0.0, observe_tick=observe)
    await core.start_job(JOB)
    async with asyncio.timeout(30):
        await core.run()
    assert len(seen) >= 3
    for wall_s, own in seen:
        assert own.num_steps >= 1
        assert 0.0 <= own.cpu_s
        assert wall_s == 0.0  # the fake clock does not move during a tick
    # The service's observer feeds the three histograms.
    before = {name: _count(name) for name in TICK_NAMES}
    observe_tick(0.2, StepTimes(wall_s=0.05, cpu_s=0.01, num_steps=3))
    assert {name: _count(name) - before[name] for name in TICK_NAMES} == dict.fromkeys(
        TICK_NAMES, 1.0)


TICK_NAMES = ("libra_scheduler_tick_seconds", "libra_scheduler_tick_own_seconds",
              "libra_scheduler_tick_cpu_seconds")


def _count(name: str) -> float:
    return REGISTRY.get_sample_value(f"{name}_count") or 0.0
