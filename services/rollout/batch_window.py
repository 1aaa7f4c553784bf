"""The batching window of externally driven episodes (``task.episode_batch_window_ms``).

An external agent's next call arrives when its program sends it, not when the loop
steps, and the calls answering one engine step come back spread over the programs'
own time and the endpoint's path. Stepping as soon as one is ready samples a batch of a
few rows, and the rest wait a whole engine call for the next one (issue 19: batches of
~10 against 32 with the internal loop, at the same engine cost per call).

So, before an engine call, the loop may hold the batch open for calls expected soon:

- only while fewer rows are ready than the batch could take and some episode of this
  instance awaits its program's next call *and is expected soon*: awaited for less than
  ``EXPECT_ROUND_TRIPS`` times the measured round trip of a call (from the reply going
  out to the next call coming in; a moving mean, at least ``MIN_EXPECT_S``). A call
  awaited longer is overdue (its program is busy: a long tool, a slow start) and is not
  waited for. Internal agents await no call, so their loop never waits;
- the window closes as soon as no awaited call is expected soon any more (all came, or
  the rest are overdue), the batch is full, or at its cap after it opened, whichever
  comes first. The cap is ``cap_s``, or the mean engine call's time if shorter: a wait
  longer than an engine call costs more than the call it saves.

Waiting pays when the engine call is long against the round trip: without it, the calls
answered by one engine call come back spread out, the first one starts the next call,
and the rest wait a whole engine call for the one after; the episodes split into
cohorts that alternate, each running one engine call in two. The wait costs at most
the cap of a turn's latency. Pure: time comes from the ``Clock``, and the wait wakes on
the loop's wake-up event (set at every arrival) or after ``POLL_S``, so a ``FakeClock``
drives it in tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from libra.clock import Clock

T = TypeVar("T")

# An awaited call is expected soon for this many mean round trips.
EXPECT_ROUND_TRIPS = 2.0
# The shortest expectation (the clock's and the event loop's own resolution).
MIN_EXPECT_S = 0.001
# Weight of the newest round trip in the moving mean.
ROUND_TRIP_WEIGHT = 0.2
# Round trips longer than this many caps are not counted: no window could catch such a
# call (a program's first call, after its start-up, is often one).
MAX_COUNTED_CAPS = 20.0
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
        self._awaited_since: dict[int, float] = {}  # one per awaited call: since when
        self._next_key = 0
        self.mean_round_trip_s: float | None = None
        """Moving mean of a call's round trip (None: none measured yet)."""
        self._cap_s = 0.0  # of the last window (longer round trips are not counted)
        self.mean_engine_s: float | None = None
        """Moving mean of an engine call's time (None: none measured yet)."""
        self.opened_s: float | None = None
        """When the window open now opened (None: the loop is not holding one)."""
        self.num_arrivals = 0
        """Awaited calls that came (since start)."""
        self.num_waits = 0
        """Engine calls held open (the window opened)."""
        self.waited_s = 0.0
        """Their total wait."""
        self.longest_wait_s = 0.0

    @property
    def num_awaiting(self) -> int:
        """Episodes whose program's next call is awaited now."""
        return len(self._awaited_since)

    async def awaiting_call(self, call: Awaitable[T]) -> T:
        """Await an episode's next call (``call``), counted as awaited meanwhile; a call
        that comes back is an arrival (one that raises, a timeout, is not)."""
        key, self._next_key = self._next_key, self._next_key + 1
        self._awaited_since[key] = self._clock.now_s()
        try:
            result = await call
        finally:
            since_s = self._awaited_since.pop(key)
        self._note_arrival(self._clock.now_s() - since_s)
        return result

    def _note_arrival(self, round_trip_s: float) -> None:
        self.num_arrivals += 1
        if self._cap_s > 0 and round_trip_s > MAX_COUNTED_CAPS * self._cap_s:
            return
        self.mean_round_trip_s = (
            round_trip_s if self.mean_round_trip_s is None
            else (1 - ROUND_TRIP_WEIGHT) * self.mean_round_trip_s
            + ROUND_TRIP_WEIGHT * round_trip_s)

    def note_engine_call(self, duration_s: float) -> None:
        """An engine call took ``duration_s`` (bounds the cap)."""
        self.mean_engine_s = (duration_s if self.mean_engine_s is None
                              else (1 - ROUND_TRIP_WEIGHT) * self.mean_engine_s
                              + ROUND_TRIP_WEIGHT * duration_s)

    def cap_s(self, job_cap_s: float) -> float:
        """The job's cap, or the mean engine call's time if shorter."""
        if self.mean_engine_s is None:
            return job_cap_s
        return min(job_cap_s, self.mean_engine_s)

    def expect_s(self, cap_s: float) -> float:
        """How long an awaited call is expected soon (``cap_s`` until a round trip is
        measured)."""
        if self.mean_round_trip_s is None:
            return cap_s
        return max(MIN_EXPECT_S, EXPECT_ROUND_TRIPS * self.mean_round_trip_s)

    def num_expected(self, cap_s: float) -> int:
        """Awaited calls expected soon (the others are overdue)."""
        since_s = self._clock.now_s() - self.expect_s(cap_s)
        return sum(1 for s in self._awaited_since.values() if s > since_s)

    def should_wait(self, num_ready: int, max_batch_size: int, cap_s: float) -> bool:
        """Whether an engine call over ``num_ready`` rows may wait for more."""
        return (cap_s > 0 and 0 < num_ready < max_batch_size
                and self.num_expected(cap_s) > 0)

    async def hold(self, num_ready: Callable[[], int], max_batch_size: int, job_cap_s: float,
                   wakeup: asyncio.Event) -> float:
        """Wait while the window is open; returns the seconds waited (0: it never opened).

        ``num_ready``: the rows ready now (re-read after every wake-up); ``job_cap_s``:
        the job's ``task.episode_batch_window_ms`` in seconds; ``wakeup``: the loop's
        event, set when a trajectory becomes ready."""
        self._cap_s = cap_s = self.cap_s(job_cap_s)
        if not self.should_wait(num_ready(), max_batch_size, cap_s):
            return 0.0
        opened_s = self.opened_s = self._clock.now_s()
        while self.should_wait(num_ready(), max_batch_size, cap_s):
            left_s = opened_s + cap_s - self._clock.now_s()
            if left_s <= 0:
                break
            await wait_for_wakeup(wakeup, min(left_s, POLL_S))
        waited_s = self._clock.now_s() - opened_s
        self.opened_s = None
        self.num_waits += 1
        self.waited_s += waited_s
        self.longest_wait_s = max(self.longest_wait_s, waited_s)
        return waited_s
