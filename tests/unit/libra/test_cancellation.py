"""raise_if_cancelled: stops a task whose cancel was swallowed below it, and only then."""

from __future__ import annotations

import asyncio

import pytest

from libra.cancellation import raise_if_cancelled


async def test_a_swallowed_cancel_is_raised_at_the_next_check() -> None:
    started = asyncio.Event()

    async def loop() -> None:
        try:
            started.set()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # a library dropped it
        raise_if_cancelled()

    task = asyncio.create_task(loop())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_own_timeout_or_no_cancel_leaves_the_task_running() -> None:
    try:
        async with asyncio.timeout(0.001):
            await asyncio.sleep(60)
    except TimeoutError:
        pass
    raise_if_cancelled()  # the timeout's cancel was its own, and cleared
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
