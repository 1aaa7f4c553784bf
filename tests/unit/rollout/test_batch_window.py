"""The batching window's rules (services/rollout/batch_window.py), on a FakeClock: when
it opens, which awaited calls it waits for (those expected within a couple of measured
round trips), and that it never waits past its cap."""

from __future__ import annotations

import asyncio

import pytest

from libra.clock import FakeClock
from services.rollout.batch_window import EXPECT_ROUND_TRIPS, MIN_EXPECT_S, BatchWindow

CAP_S = 0.010


class Calls:
    """Awaited calls that come when the test says (``come(i)``)."""

    def __init__(self, window: BatchWindow) -> None:
        self._window = window
        self._events: list[asyncio.Event] = []
        self.tasks: list[asyncio.Task] = []

    async def await_one(self) -> int:
        event = asyncio.Event()
        self._events.append(event)
        self.tasks.append(asyncio.create_task(self._window.awaiting_call(event.wait())))
        await asyncio.sleep(0)  # let it start: it is awaited from now
        return len(self._events) - 1

    async def come(self, index: int) -> None:
        self._events[index].set()
        await self.tasks[index]


def window_with_round_trip(clock: FakeClock, round_trip_s: float) -> BatchWindow:
    window = BatchWindow(clock)
    window.mean_round_trip_s = round_trip_s
    return window


async def test_the_window_opens_only_for_calls_expected_soon_and_room_in_the_batch() -> None:
    clock = FakeClock()
    window = window_with_round_trip(clock, 0.004)
    assert not window.should_wait(1, 8, CAP_S)  # nothing awaited (internal agents)
    calls = Calls(window)
    await calls.await_one()
    assert window.should_wait(1, 8, CAP_S)
    assert not window.should_wait(0, 8, CAP_S)  # nothing ready: no engine call to hold
    assert not window.should_wait(8, 8, CAP_S)  # the batch is full
    assert not window.should_wait(1, 8, 0.0)  # the window is off
    clock.advance(EXPECT_ROUND_TRIPS * 0.004)  # overdue: its program is busy
    assert not window.should_wait(1, 8, CAP_S)
    await calls.come(0)


async def test_the_round_trip_is_measured_from_the_wait_to_the_arrival() -> None:
    clock = FakeClock()
    window = BatchWindow(clock)
    assert window.expect_s(CAP_S) == CAP_S  # nothing measured yet: the cap
    calls = Calls(window)
    for _ in range(30):
        index = await calls.await_one()
        clock.advance(0.003)
        await calls.come(index)
    assert window.mean_round_trip_s == pytest.approx(0.003)
    assert window.expect_s(CAP_S) == pytest.approx(EXPECT_ROUND_TRIPS * 0.003)
    assert (window.num_arrivals, window.num_awaiting) == (30, 0)
    for _ in range(30):  # calls that come at once: the floor
        await calls.come(await calls.await_one())
    assert window.expect_s(CAP_S) == MIN_EXPECT_S


async def test_a_call_no_window_could_catch_is_not_counted() -> None:
    clock = FakeClock()
    window = window_with_round_trip(clock, 0.003)
    await window.hold(lambda: 1, 8, CAP_S, asyncio.Event())  # learns the cap
    calls = Calls(window)
    index = await calls.await_one()
    clock.advance(30 * CAP_S)  # a program's start-up, a long tool
    await calls.come(index)
    assert window.mean_round_trip_s == 0.003


async def test_a_failed_wait_is_not_an_arrival() -> None:
    window = BatchWindow(FakeClock())

    async def timed_out() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await window.awaiting_call(timed_out())
    assert (window.num_awaiting, window.num_arrivals, window.mean_round_trip_s) == (0, 0, None)


async def held_for_one_awaited_call(
        round_trip_s: float) -> tuple[FakeClock, BatchWindow, Calls, asyncio.Task]:
    """A window holding one ready row while one call (of that round trip) is awaited."""
    clock = FakeClock()
    window = window_with_round_trip(clock, round_trip_s)
    calls = Calls(window)
    await calls.await_one()
    holding = asyncio.create_task(window.hold(lambda: 1, 8, CAP_S, asyncio.Event()))
    while window.opened_s is None:
        await asyncio.sleep(0)
    return clock, window, calls, holding


async def test_hold_ends_at_the_cap_while_calls_are_still_expected() -> None:
    clock, window, calls, holding = await held_for_one_awaited_call(1.0)  # expected for 2 s
    clock.advance(CAP_S)
    assert await holding == pytest.approx(CAP_S)
    assert (window.num_waits, window.opened_s, window.num_awaiting) == (1, None, 1)
    await calls.come(0)


async def test_hold_ends_when_the_awaited_call_is_overdue() -> None:
    clock, _, calls, holding = await held_for_one_awaited_call(0.002)  # expected for 4 ms
    clock.advance(0.004)
    assert await holding == pytest.approx(0.004)
    await calls.come(0)


async def test_the_cap_is_at_most_an_engine_call() -> None:
    window = BatchWindow(FakeClock())
    assert window.cap_s(CAP_S) == CAP_S  # no engine call measured yet
    for _ in range(20):
        window.note_engine_call(0.004)
    assert window.cap_s(CAP_S) == pytest.approx(0.004)
    assert window.cap_s(0.001) == 0.001
