"""The time a coroutine spends running its own steps, apart from the time it waits.

On one event loop the wall time of ``await work()`` counts three things: the work's own
steps, its waits for I/O (a Redis round trip), and every other task the loop ran while it
waited (the scheduler's report handlers run while its tick awaits Redis). A scheduler
tick's wall time at 1,000 instances was mostly the last two, so a histogram of it alone
cannot say whether the tick got slower or the loop got busier. ``timed`` runs a
coroutine as usual and adds up, over each step it runs (each stretch between two of its
awaits that suspend), the wall time and this thread's CPU time: the coroutine's own work.
Own wall minus own CPU is the time the OS ran something else during its steps (a busy
host); total wall minus own wall is the time it waited.

Pure (stdlib only): no clock is injected because these are measurements, never inputs
to a decision.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class StepTimes:
    """What ``timed`` added up for one coroutine (more than one when reused)."""

    wall_s: float = 0.0
    """Wall time inside the coroutine's own steps."""
    cpu_s: float = 0.0
    """This thread's CPU time inside them (``time.thread_time``)."""
    num_steps: int = 0
    """Steps run: its suspending awaits + 1."""


class _Timed:
    """An awaitable that drives ``coro`` step by step, timing each step."""

    __slots__ = ("_coro", "_times")

    def __init__(self, coro: Coroutine[Any, Any, Any], times: StepTimes) -> None:
        self._coro = coro
        self._times = times

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, times = self._coro, self._times
        value: Any = None
        thrown: BaseException | None = None
        while True:
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            try:
                yielded = coro.send(value) if thrown is None else coro.throw(thrown)
            except StopIteration as stop:
                return stop.value
            finally:
                times.wall_s += time.perf_counter() - wall0
                times.cpu_s += time.thread_time() - cpu0
                times.num_steps += 1
            try:
                # What the coroutine awaits (a future) goes to the task driving us, and
                # what the task sends back or throws in (a cancellation) goes to it.
                value, thrown = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine
                value, thrown = None, exc


async def timed(coro: Coroutine[Any, Any, T], times: StepTimes) -> T:
    """Await ``coro`` and add its own steps' wall and CPU time to ``times`` (also when
    it raises or is cancelled)."""
    result: T = await _Timed(coro, times)
    return result
