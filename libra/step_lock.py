"""Coroutines of two threads' event loops sharing state as if they ran on one loop.

On one event loop the code between two awaits runs alone: that is what makes state
shared by coroutines safe without locks. The scheduler runs its tick on an event loop of
its own thread (so that the tick's replies from Redis are not read only after the report
batches queued on the gRPC loop; see ``services/scheduler/__main__.py``) while reports
are decided on the gRPC loop, and both work on the same jobs. ``locked`` keeps the
one-loop rule across the two: it drives a coroutine step by step, as ``step_timing``
does, and holds ``lock`` (a ``threading.RLock``) during each step, never across an
await that suspends. Every entry point into the shared state runs under it, so each
step is atomic with respect to every other, exactly as on one loop.

A step holds the lock for as long as it runs (the tick's longest is its placement pass,
a few ms); a step of the other thread waits that long, which one loop would have made it
wait too. The lock is re-entrant: a locked coroutine may await another one.

``PriorityLock`` lets one side go first. A plain lock is not fair: the report loop, which
holds the interpreter most of the time at 1,000 instances, released the lock and took it
again for its next batch before the woken tick thread could run, so the tick waited for
a whole burst of batches at every step, as on one loop (measured: tick p99 215 ms with a
plain lock, as before the thread). Steps taken through ``PriorityLock.high`` go before
every ``low`` one waiting: a low acquirer waits while a high one does, and blocking on
the condition hands the interpreter to the tick thread.

Pure (stdlib only).
"""

from __future__ import annotations

import threading
from collections.abc import Coroutine, Generator
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class StepLock(Protocol):
    """What ``locked`` needs of a lock (``threading.RLock`` has it)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...


class PriorityLock:
    """A re-entrant lock with two ways in: ``high`` (goes first) and ``low``."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._num_high_waiting = 0
        self._num_low_waiting = 0
        self.high = _Side(self, is_high=True)
        """Acquire before any ``low`` acquirer waiting (``with lock.high:``)."""
        self.low = _Side(self, is_high=False)
        """Acquire once no ``high`` acquirer holds or waits."""

    def _acquire(self, is_high: bool) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:  # re-entered by its holder
                self._depth += 1
                return
            self._count_waiting(is_high, 1)
            try:
                while self._owner is not None or (not is_high and self._num_high_waiting):
                    self._cond.wait()
            finally:
                self._count_waiting(is_high, -1)
            self._owner, self._depth = me, 1

    def _count_waiting(self, is_high: bool, delta: int) -> None:
        if is_high:
            self._num_high_waiting += delta
        else:
            self._num_low_waiting += delta

    @property
    def num_waiting(self) -> tuple[int, int]:
        """Acquirers waiting now: (high, low)."""
        with self._cond:
            return self._num_high_waiting, self._num_low_waiting

    def _release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a PriorityLock not held by this thread")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()


class _Side:
    """One way into a ``PriorityLock``, as a context manager."""

    __slots__ = ("_is_high", "_lock")

    def __init__(self, lock: PriorityLock, is_high: bool) -> None:
        self._lock, self._is_high = lock, is_high

    def __enter__(self) -> None:
        self._lock._acquire(self._is_high)  # noqa: SLF001 - its own lock's

    def __exit__(self, *_exc: object) -> None:
        self._lock._release()  # noqa: SLF001


class _Locked:
    """An awaitable that drives ``coro`` step by step, each step under ``lock``."""

    __slots__ = ("_coro", "_lock")

    def __init__(self, coro: Coroutine[Any, Any, Any], lock: StepLock) -> None:
        self._coro = coro
        self._lock = lock

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, lock = self._coro, self._lock
        value: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                with lock:
                    yielded = coro.send(value) if thrown is None else coro.throw(thrown)
            except StopIteration as stop:
                return stop.value
            try:
                # What the coroutine awaits goes to the task driving us (the lock is
                # free meanwhile), and what the task sends or throws in goes to it.
                value, thrown = (yield yielded), None
            except GeneratorExit:
                with lock:
                    coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine
                value, thrown = None, exc


async def locked(coro: Coroutine[Any, Any, T], lock: StepLock) -> T:
    """Await ``coro`` with each of its steps run under ``lock`` (released at every
    suspending await, also when it raises or is cancelled)."""
    result: T = await _Locked(coro, lock)
    return result
