"""Per-step scheduler activity in the trainer's step record (report.json ``steps[]``):
``migrations`` and ``bucket_occupancy`` are deltas of the job's cumulative counters.
In-memory store (the Redis store's counters are in tests/store's contract suite); the
rest of the trainer is not involved."""

from __future__ import annotations

from typing import Any

from libra.clock import FakeClock
from services.trainer.core import TrainerCore
from services.trainer.memory_store import MemoryTrainerStore

JOB = "job-1"


async def test_step_record_holds_deltas_since_the_previous_step() -> None:
    store = MemoryTrainerStore()
    unused: Any = None
    core = TrainerCore(store, unused, unused, FakeClock())
    store.set_counters(JOB, **{"placed:short": 8, "migrations": 1, "trained": 4})
    before = await store.counters(JOB)
    store.add_counters(JOB, **{"placed:short": 4, "placed:long": 2, "migrations": 2})
    now, record = await core._placement_deltas(JOB, before)
    assert record == {"migrations": 2, "bucket_occupancy": {"long": 2, "short": 4}}
    _, second = await core._placement_deltas(JOB, now)
    assert second == {"migrations": 0, "bucket_occupancy": {"long": 0, "short": 0}}
