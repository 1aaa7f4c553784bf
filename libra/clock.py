"""Time as a collaborator, so cores can be tested with a fake clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """The time a core reads; ``SystemClock`` in services, ``FakeClock`` in tests, so
    timeouts and TTLs are tested without sleeping."""

    def now_s(self) -> float:
        """Seconds since the epoch."""
        ...

    def now_ms(self) -> int:
        """Milliseconds since the epoch (lease expiries and timestamps are in ms)."""
        ...


class SystemClock:
    """Wall-clock time (for timestamps) from ``time.time``."""

    def now_s(self) -> float:
        """Seconds since the epoch, from ``time.time``."""
        return time.time()

    def now_ms(self) -> int:
        """Milliseconds since the epoch, from ``time.time``."""
        return int(time.time() * 1000)


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self, start_s: float = 1_000.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        """The time the test set (starts at ``start_s``)."""
        return self._now_s

    def now_ms(self) -> int:
        """The time the test set, in ms."""
        return int(self._now_s * 1000)

    def advance(self, seconds: float) -> None:
        """Move the clock forward, as if ``seconds`` had passed."""
        self._now_s += seconds
