"""Whether the host itself stalled during a benchmark run, or its wall clock jumped.

Redis expires keys by its wall clock (``mstime``), while every lease holder times its
renewals on the monotonic clock. A host that freezes all processes for a few seconds, or
a wall clock stepped forward, expires leases whose holders did nothing wrong: session 15
saw one run lose all 1,000 leases at once, 6 s after their last renewal with 12 s TTLs.
A thread that sleeps ``period_s`` and notes how late it woke (the longest stall any
process here could have seen) and how far the wall clock moved apart from the monotonic
one (a step, an NTP slew, or a freeze the monotonic clock did not count) tells such a run
from a defect of ours.
"""

from __future__ import annotations

import threading
import time


class HostWatch:
    """A daemon thread measuring wake-up lateness and wall-clock steps until ``stop``."""

    def __init__(self, period_s: float = 0.05) -> None:
        self._period_s = period_s
        self._stop = threading.Event()
        self.max_late_ms = 0.0
        """The longest a ``period_s`` sleep overslept (ms): the host's worst stall seen."""
        self.max_clock_step_ms = 0.0
        """The largest change of wall minus monotonic time between two wake-ups (ms)."""
        self._thread = threading.Thread(target=self._watch, name="host-watch", daemon=True)

    def start(self) -> HostWatch:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop watching; the figures (ms, rounded)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        return {"host_late_max_ms": round(self.max_late_ms, 1),
                "wall_clock_step_max_ms": round(self.max_clock_step_ms, 1)}

    def _watch(self) -> None:
        offset_s = time.time() - time.monotonic()
        before_s = time.monotonic()
        while not self._stop.wait(self._period_s):
            now_s = time.monotonic()
            self.max_late_ms = max(self.max_late_ms,
                                   1000 * (now_s - before_s - self._period_s))
            new_offset_s = time.time() - now_s
            self.max_clock_step_ms = max(self.max_clock_step_ms,
                                         1000 * abs(new_offset_s - offset_s))
            offset_s, before_s = new_offset_s, now_s
