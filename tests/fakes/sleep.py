"""Fake ``sleep`` for cores that back off (``libra.retry``).

Replaces: ``asyncio.sleep`` in retry loops. Each call records the delay, advances the
given ``FakeClock`` by it and yields to the event loop once, so a whole backoff runs
without waiting and the time it covers is exact.
"""

from __future__ import annotations

import asyncio

from libra.clock import FakeClock


class FakeSleep:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.delays_s: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays_s.append(delay_s)
        self.clock.advance(delay_s)
        await asyncio.sleep(0)
