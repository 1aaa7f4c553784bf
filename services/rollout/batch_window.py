"""The batching window of externally driven episodes (``task.episode_batch_window_ms``).

An external agent's next call arrives when its program sends it, not when the loop
steps, and the calls answering one engine step come back spread over the programs'
own time and the endpoint's path. Stepping as soon as one is ready samples a batch of a
few rows, and the rest wait a whole engine call for the next one (issue 19: batches of
~10 against 32 with the internal loop, at the same engine cost per call).

So, before an engine call, the loop may hold the batch open while calls keep arriving:

- only while some episodes of this instance await their program's next call (the
  awaited ones, counted here around each wait) and fewer rows are ready than the batch
  could take: internal agents await no call, so their loop never waits;
- the window closes once a quiet spell passes without a new arrival: a few times the
  measured gap between consecutive arrivals (a moving mean over arrivals that came
  within the cap of each other, so the pause between bursts does not count), at least
  ``MIN_QUIET_S``;
- and at the latest ``cap_s`` after it opened, however the arrivals go.

The wait costs at most ``cap_s`` of a turn's latency; the gain is one engine call
instead of several for the same rows. Pure: time comes from the ``Clock``, and the wait
wakes on the loop's wake-up event (set at every arrival) or after ``POLL_S``, so a
``FakeClock`` drives it in tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from libra.clock import Clock

T = TypeVar("T")

# The quiet spell that closes the window, in mean arrival gaps: arrivals within one
# burst come about a mean gap apart, so three of them without one means the burst ended.
QUIET_GAPS = 3.0
# The shortest quiet spell (the clock's and the event loop's own resolution).
MIN_QUIET_S = 0.0005
# Weight of the newest gap in the moving mean.
GAP_WEIGHT = 0.2
# The longest real sleep between looks at the clock while the window is open (a fake
# clock only moves between them).
POLL_S = 0.002


async def wait_for_wakeup(wakeup: asyncio.Event, timeout_s: float) -> None:
    """Sleep until ``wakeup`` is set or ``timeout_s`` passes, then clear it."""
    try:
        async with asyncio.timeout(timeout_s):
            await wakeup.wait()
    except TimeoutError:
        pass
    wakeup.clear()


class BatchWindow:
    """The window of one rollout loop (its counters feed status and the benchmark)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.num_awaiting = 0
        """Episodes whose program's next call is awaited now."""
        self.num_arrivals = 0
        """Awaited calls that came (since start)."""
        self.mean_gap_s: float | None = None
        """Moving mean of the gap between consecutive arrivals (None: none measured)."""
        self._last_arrival_s: float | None = None
        self._cap_s = 0.0  # of the window open now (gaps longer than it do not count)
        self.opened_s: float | None = None
        """When the window open now opened (None: the loop is not holding one)."""
        self.num_waits = 0
        """Engine calls held open (the window opened)."""
        self.waited_s = 0.0
        """Their total wait."""
        self.longest_wait_s = 0.0

    async def awaiting_call(self, call: Awaitable[T]) -> T:
        """Await an episode's next call (``call``), counted as awaited meanwhile; a call
        that comes back is an arrival (one that raises, a timeout, is not)."""
        self.num_awaiting += 1
        try:
            result = await call
        finally:
            self.num_awaiting -= 1
        self._note_arrival()
        return result

    def _note_arrival(self) -> None:
        self.num_arrivals += 1
        now_s = self._clock.now_s()
        last_s, self._last_arrival_s = self._last_arrival_s, now_s
        if last_s is None:
            return
        gap_s = now_s - last_s
        if self._cap_s > 0 and gap_s > self._cap_s:
            return  # between bursts: not the spacing of calls that could share a step
        self.mean_gap_s = (gap_s if self.mean_gap_s is None
                           else (1 - GAP_WEIGHT) * self.mean_gap_s + GAP_WEIGHT * gap_s)

    def should_wait(self, num_ready: int, max_batch_size: int, cap_s: float) -> bool:
        """Whether an engine call over ``num_ready`` rows may wait for more."""
        return cap_s > 0 and 0 < num_ready < max_batch_size and self.num_awaiting > 0

    def quiet_s(self, cap_s: float) -> float:
        """The quiet spell that closes the window (``cap_s`` until a gap is measured)."""
        if self.mean_gap_s is None:
            return cap_s
        return min(cap_s, max(MIN_QUIET_S, QUIET_GAPS * self.mean_gap_s))

    def deadline_s(self, opened_s: float, cap_s: float) -> float:
        """When the window opened at ``opened_s`` closes, as things stand now."""
        last_s = self._last_arrival_s if self._last_arrival_s is not None else opened_s
        return min(opened_s + cap_s, last_s + self.quiet_s(cap_s))

    async def hold(self, num_ready: Callable[[], int], max_batch_size: int, cap_s: float,
                   wakeup: asyncio.Event) -> float:
        """Wait while the window is open; returns the seconds waited (0: it never opened).

        ``num_ready``: the rows ready now (re-read after every wake-up); ``wakeup``: the
        loop's event, set when a trajectory becomes ready."""
        self._cap_s = cap_s
        if not self.should_wait(num_ready(), max_batch_size, cap_s):
            return 0.0
        opened_s = self.opened_s = self._clock.now_s()
        while self.should_wait(num_ready(), max_batch_size, cap_s):
            left_s = self.deadline_s(opened_s, cap_s) - self._clock.now_s()
            if left_s <= 0:
                break
            await wait_for_wakeup(wakeup, min(left_s, POLL_S))
        waited_s = self._clock.now_s() - opened_s
        self.opened_s = None
        self.num_waits += 1
        self.waited_s += waited_s
        self.longest_wait_s = max(self.longest_wait_s, waited_s)
        return waited_s
