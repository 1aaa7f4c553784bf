"""Time as a collaborator, so cores can be tested with a fake clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float: ...

    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock time (for timestamps) from ``time.time``."""

    def now_s(self) -> float:
        return time.time()

    def now_ms(self) -> int:
        return int(time.time() * 1000)


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self, start_s: float = 1_000.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def now_ms(self) -> int:
        return int(self._now_s * 1000)

    def advance(self, seconds: float) -> None:
        self._now_s += seconds
