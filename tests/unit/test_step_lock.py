"""``locked`` (libra/step_lock.py) and ``LoopThread`` (libra/loop_thread.py): coroutines
on two threads' loops whose steps never overlap, while the lock is free across awaits.

Real threads and event loops; the order of events is forced with thread events, so no
assertion depends on timing. A wait that is expected to run out (the other thread is
held off by the lock) is short; one expected to end early is long and ends at once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from libra.loop_thread import LoopThread
from libra.step_lock import PriorityLock, locked

HELD_OFF_S = 0.3  # how long a step waits for what the lock must keep out
EXPECTED_S = 30.0  # how long a wait for what must come may take at most


def _is_free(lock: threading.RLock) -> bool:
    """Whether this thread can take ``lock`` (waiting up to EXPECTED_S); left free."""
    if not lock.acquire(timeout=EXPECTED_S):
        return False
    lock.release()
    return True


@pytest.fixture
def other() -> LoopThread:
    thread = LoopThread("test-other")
    yield thread
    thread.stop()


async def _step_waits_inside(inside: threading.Event, entered: threading.Event,
                             saw: list[bool]) -> str:
    inside.set()
    # A blocking wait inside one step: the other thread's step must not start meanwhile.
    saw.append(entered.wait(HELD_OFF_S))
    return "first"


async def _enter(entered: threading.Event) -> str:
    entered.set()
    return "second"


async def _race(other: LoopThread, lock: Any, here: Any = None) -> list[bool]:
    """Thread A runs a step that waits for B's step to start; B starts its step once A is
    inside. Returns whether A saw B enter during its step."""
    inside, entered, saw = threading.Event(), threading.Event(), []
    first = asyncio.create_task(other.run(locked(_step_waits_inside(inside, entered, saw),
                                                 lock)))
    here = lock if here is None else here
    assert await asyncio.to_thread(inside.wait, EXPECTED_S)
    # B's step: it waits for the lock (on this loop's thread) until A's step ended.
    assert await locked(_enter(entered), here) == "second"
    assert await first == "first"
    return saw


async def test_steps_on_two_loops_never_overlap(other: LoopThread) -> None:
    # A's step waits for B inside it; B's step waits for the lock, so A never sees it.
    assert await _race(other, threading.RLock()) == [False]


async def test_steps_on_two_loops_never_overlap_with_the_priority_lock(
        other: LoopThread) -> None:
    lock = PriorityLock()
    assert await _race(other, lock.high, lock.low) == [False]
    assert await _race(other, lock.low, lock.high) == [False]


async def test_without_the_lock_the_steps_overlap(other: LoopThread) -> None:
    # The same race with no lock: B enters during A's step (the test above can fail).
    inside, entered, saw = threading.Event(), threading.Event(), []

    async def waits_long() -> None:
        inside.set()
        saw.append(entered.wait(EXPECTED_S))

    first = asyncio.create_task(other.run(locked(waits_long(), contextlib.nullcontext())))
    assert await asyncio.to_thread(inside.wait, EXPECTED_S)
    await locked(_enter(entered), contextlib.nullcontext())
    await first
    assert saw == [True]


async def test_the_lock_is_free_while_the_coroutine_waits(other: LoopThread) -> None:
    lock, resume = threading.RLock(), asyncio.Event()
    suspended = threading.Event()

    async def waits() -> str:
        suspended.set()
        await resume.wait()  # suspends: the other loop's steps may run now
        return "done"

    task = asyncio.create_task(locked(waits(), lock))
    assert await asyncio.to_thread(suspended.wait, EXPECTED_S)
    # A step on the other thread runs to its end while ours is suspended.
    assert await other.run(locked(_enter(threading.Event()), lock)) == "second"
    resume.set()
    assert await task == "done"


async def test_a_locked_coroutine_may_await_another(other: LoopThread) -> None:
    lock = threading.RLock()

    async def outer() -> str:
        return await locked(_enter(threading.Event()), lock) + "!"

    assert await other.run(locked(outer(), lock)) == "second!"


async def test_an_error_reaches_the_caller_and_frees_the_lock(other: LoopThread) -> None:
    lock = threading.RLock()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("step 2")

    with pytest.raises(ValueError, match="step 2"):
        await other.run(locked(fails(), lock))
    assert _is_free(lock)  # not left held by the other thread


async def test_cancelling_the_caller_cancels_the_coroutine_on_the_other_loop(
        other: LoopThread) -> None:
    lock, started, cancelled = threading.RLock(), threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(other.run(locked(forever(), lock)))
    assert await asyncio.to_thread(started.wait, EXPECTED_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(cancelled.wait, EXPECTED_S)
    assert await asyncio.to_thread(_is_free, lock)


async def test_run_on_its_own_thread_runs_in_place(other: LoopThread) -> None:
    async def where() -> bool:
        return other.is_current()

    async def nested() -> bool:
        return await other.run(where())  # already there: awaited in place

    assert await other.run(nested()) is True
    assert other.is_current() is False


# -- PriorityLock: the tick's steps go first ---------------------------------------------


def _until(holds: Callable[[], bool]) -> None:
    """Poll ``holds`` until true (fails after EXPECTED_S)."""
    deadline_s = time.monotonic() + EXPECTED_S
    while not holds():
        assert time.monotonic() < deadline_s, "condition not reached"
        time.sleep(0.001)


def test_a_waiting_high_acquirer_goes_before_a_low_one_that_waited_longer() -> None:
    lock, order = PriorityLock(), []

    def take(side: str) -> None:
        with getattr(lock, side):
            order.append(side)

    with lock.low:  # held: both must wait
        low = threading.Thread(target=take, args=("low",))
        low.start()
        _until(lambda: lock.num_waiting == (0, 1))  # the low one waits first
        high = threading.Thread(target=take, args=("high",))
        high.start()
        _until(lambda: lock.num_waiting == (1, 1))
    low.join(EXPECTED_S)
    high.join(EXPECTED_S)
    assert order == ["high", "low"]


def test_a_priority_lock_is_reentrant_for_its_holder_only() -> None:
    lock, got = PriorityLock(), []
    with lock.high, lock.low:  # the holder re-enters by either side
        other = threading.Thread(target=lambda: got.append(lock.low.__enter__()))
        other.start()
        _until(lambda: lock.num_waiting == (0, 1))
        assert got == []  # held: the other thread waits
    other.join(EXPECTED_S)
    assert got == [None]
    with pytest.raises(RuntimeError, match="not held by this thread"):
        lock.low.__exit__()  # held by the other thread now
