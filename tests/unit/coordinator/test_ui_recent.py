"""The view's cache of slow-changing reads (leases, job list): fresh, refreshed in the
background, or read before answering; a failed background read keeps the last value."""

from __future__ import annotations

import asyncio

from services.coordinator.ui import _Recent


class Reads:
    """A read that returns 1, 2, 3, ... and can be told to fail."""

    def __init__(self) -> None:
        self.num_reads = 0
        self.error: Exception | None = None

    async def __call__(self) -> int:
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        self.num_reads += 1
        return self.num_reads


def recent(reads: Reads, now: list[float]) -> _Recent[int]:
    return _Recent(reads, fresh_s=1.0, stale_s=10.0, clock=lambda: now[0])


async def test_the_first_get_reads_and_a_fresh_value_is_reused() -> None:
    reads, now = Reads(), [100.0]
    cache = recent(reads, now)
    assert await cache.get() == 1
    now[0] += 0.5
    assert await cache.get() == 1 and reads.num_reads == 1


async def test_an_old_value_is_served_while_one_background_read_refreshes_it() -> None:
    reads, now = Reads(), [100.0]
    cache = recent(reads, now)
    await cache.get()
    now[0] += 5.0
    assert await cache.get() == 1  # served at once
    assert await cache.get() == 1  # no second refresh while one runs
    for _ in range(5):
        await asyncio.sleep(0)
    assert reads.num_reads == 2 and await cache.get() == 2


async def test_a_value_older_than_the_stale_limit_is_read_before_answering() -> None:
    reads, now = Reads(), [100.0]
    cache = recent(reads, now)
    await cache.get()
    now[0] += 11.0
    assert await cache.get() == 2


async def test_a_failed_background_read_keeps_the_last_value() -> None:
    reads, now = Reads(), [100.0]
    cache = recent(reads, now)
    await cache.get()
    reads.error = ConnectionError("redis down")
    now[0] += 5.0
    assert await cache.get() == 1
    for _ in range(5):
        await asyncio.sleep(0)
    reads.error = None
    assert await cache.get() == 1  # still the old one; a new refresh starts
    for _ in range(5):
        await asyncio.sleep(0)
    assert await cache.get() == 2
