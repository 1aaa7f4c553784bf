"""The gate between the scheduler's tick and the report batches that share its event
loop (``SchedulerCore.tick_done``): closed while the tick computes, ajar while it awaits
Redis, open between ticks.

Why ajar, and why bounded: while the tick awaits one of its two Redis round trips the
loop is otherwise idle, so a batch decided then costs the tick nothing until the reply
is in; a burst of them costs it their CPU (0.2-0.4 ms a batch), which is what session 16
took out of the tick's wall time. ``per_await_batches`` bounds that: at most that many
batches pass during one await (the oldest parked first, then arrivals), the others stay
parked until the tick's next await or its end. A batch let through is never held back
again: it runs to its end, interleaving with the tick only at awaits.
"""

from __future__ import annotations

import asyncio
import collections


class TickGate:
    """Closed while a tick computes (``tick_started``, ``tick_resumed``), ajar while it
    awaits Redis (``tick_awaits``), open between ticks (``tick_ended``); report batches
    ``wait`` at it, in order. Outside a tick the tick's calls change nothing (a test may
    run a tick's body alone)."""

    def __init__(self, per_await_batches: int) -> None:
        self._per_await_batches = per_await_batches
        self._is_ticking = False
        # Batches that may still pass during the current await (0 while closed). Only
        # non-zero once every parked batch was let through: arrivals never overtake.
        self._passes_left = 0
        self._parked: collections.deque[asyncio.Future[None]] = collections.deque()

    def tick_started(self) -> None:
        """A tick starts: batches park."""
        self._is_ticking, self._passes_left = True, 0

    def tick_awaits(self) -> None:
        """The tick awaits Redis: let up to ``per_await_batches`` batches through."""
        if self._is_ticking:
            self._passes_left = self._per_await_batches
            self._wake(self._per_await_batches)

    def tick_resumed(self) -> None:
        """The tick resumes its own work: batches park again."""
        self._passes_left = 0

    def tick_ended(self) -> None:
        """The tick ended: every parked batch runs, in order, before the next tick."""
        self._is_ticking, self._passes_left = False, 0
        self._wake(len(self._parked))

    async def wait(self) -> None:
        """Return at once when open, or ajar with passes left; else park until let
        through."""
        if not self._is_ticking:
            return
        if self._passes_left > 0:
            self._passes_left -= 1
            return
        parked = asyncio.get_running_loop().create_future()
        self._parked.append(parked)
        await parked  # one cancelled while parked stays in line, skipped by ``_wake``

    def _wake(self, count: int) -> None:
        while count > 0 and self._parked:
            parked = self._parked.popleft()
            if parked.done():  # cancelled meanwhile
                continue
            parked.set_result(None)
            count -= 1
            if self._is_ticking:
                self._passes_left -= 1
