"""The batching window's rules (services/rollout/batch_window.py), on a FakeClock: when
it opens, how its quiet spell follows the measured gap between calls, and that its
deadline never passes the cap."""

from __future__ import annotations

import asyncio
import random

import pytest

from libra.clock import FakeClock
from services.rollout.batch_window import MIN_QUIET_S, QUIET_GAPS, BatchWindow

CAP_S = 0.010


async def arrive(window: BatchWindow) -> None:
    """One awaited call that comes back."""

    async def call() -> str:
        return "call"

    assert await window.awaiting_call(call()) == "call"


@pytest.mark.parametrize("num_ready, max_batch, cap_s, num_awaiting, expected", [
    (1, 8, CAP_S, 3, True),
    (1, 8, CAP_S, 0, False),   # nothing awaited (internal agents)
    (0, 8, CAP_S, 3, False),   # nothing ready: the loop waits for work, not for a window
    (8, 8, CAP_S, 3, False),   # the batch is full
    (1, 8, 0.0, 3, False),     # the window is off
])
def test_the_window_opens_only_for_awaited_calls_and_room_in_the_batch(
        num_ready, max_batch, cap_s, num_awaiting, expected) -> None:
    window = BatchWindow(FakeClock())
    window.num_awaiting = num_awaiting
    assert window.should_wait(num_ready, max_batch, cap_s) is expected


async def test_the_quiet_spell_follows_the_gap_between_calls() -> None:
    clock = FakeClock()
    window = BatchWindow(clock)
    assert window.quiet_s(CAP_S) == CAP_S  # nothing measured yet: the cap
    for _ in range(30):
        await arrive(window)
        clock.advance(0.001)
    assert window.mean_gap_s == pytest.approx(0.001)
    assert window.quiet_s(CAP_S) == pytest.approx(QUIET_GAPS * 0.001)
    for _ in range(30):  # calls at the same instant: the floor
        await arrive(window)
    assert window.quiet_s(CAP_S) == MIN_QUIET_S


async def test_a_pause_between_bursts_is_not_a_gap_between_calls() -> None:
    clock = FakeClock()
    window = BatchWindow(clock)
    await window.hold(lambda: 1, 8, CAP_S, asyncio.Event())  # learns the cap
    await arrive(window)
    clock.advance(0.001)
    await arrive(window)
    clock.advance(10 * CAP_S)  # an engine call's worth of silence
    await arrive(window)
    assert window.mean_gap_s == pytest.approx(0.001)


async def test_a_failed_wait_is_not_an_arrival() -> None:
    window = BatchWindow(FakeClock())

    async def timed_out() -> None:
        raise TimeoutError

    with pytest.raises(TimeoutError):
        await window.awaiting_call(timed_out())
    assert (window.num_awaiting, window.mean_gap_s) == (0, None)


@pytest.mark.parametrize("seed", range(20))
async def test_the_deadline_never_passes_the_cap(seed) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    window = BatchWindow(clock)
    for _ in range(rng.randrange(1, 40)):
        clock.advance(rng.choice([0.0, rng.uniform(0, 2 * CAP_S)]))
        await arrive(window)
    opened_s = clock.now_s() - rng.uniform(0, CAP_S)
    assert opened_s < window.deadline_s(opened_s, CAP_S) <= opened_s + CAP_S


async def test_hold_returns_once_the_clock_reaches_the_deadline() -> None:
    clock = FakeClock()
    window = BatchWindow(clock)
    window.num_awaiting = 5  # calls that never come
    holding = asyncio.create_task(window.hold(lambda: 1, 8, CAP_S, asyncio.Event()))
    while window.opened_s is None:
        await asyncio.sleep(0)
    clock.advance(CAP_S)
    assert await holding == pytest.approx(CAP_S)
    assert (window.num_waits, window.opened_s) == (1, None)
