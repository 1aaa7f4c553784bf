"""raise_if_cancelled: stops a task whose cancel was swallowed below it, and only then;
stop_task: a shutdown that cancels again until the task ends; the health watcher, which
ends on one cancel even when its Redis probe swallowed it."""

from __future__ import annotations

import asyncio

import pytest

from libra.cancellation import raise_if_cancelled, stop_task
from libra.grpcx import watch_dependency


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


async def swallows_one_cancel(started: asyncio.Event) -> None:
    """A loop whose first cancel a library below it dropped: only a second one ends it."""
    started.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(60)


async def test_stop_task_cancels_again_until_the_task_ends() -> None:
    started = asyncio.Event()
    task = asyncio.create_task(swallows_one_cancel(started))
    await started.wait()
    stopping = asyncio.create_task(stop_task(task, retry_s=0.01))
    await asyncio.wait({stopping}, timeout=30)
    assert stopping.done() and task.cancelled() and task.cancelling() == 2


async def test_stop_task_drops_the_error_of_a_task_that_failed() -> None:
    async def fails() -> None:
        raise RuntimeError("the loop failed before shutdown")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop_task(task)
    assert task.done() and not task.cancelled()


class HealthRecorder:
    """What ``watch_dependency`` uses of a server: its name and the health it sets."""

    service = "unit"

    def __init__(self) -> None:
        self.serving: list[bool] = []

    async def set_serving(self, serving: bool) -> None:
        self.serving.append(serving)


async def test_health_watcher_ends_on_one_cancel_its_probe_swallowed() -> None:
    """As redis-py's PING on 3.11 when the cancel lands as the reply arrives (gh-86296):
    the probe returns normally. The watcher still ends on that one cancel."""
    probing = asyncio.Event()

    async def probe() -> str:
        probing.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "PONG"
        return "PONG"

    server = HealthRecorder()
    task = asyncio.create_task(watch_dependency(server, probe, interval_s=0.01))  # type: ignore[arg-type]
    await probing.wait()
    task.cancel()
    await asyncio.wait({task}, timeout=30)
    assert task.cancelled()
    assert server.serving == []  # healthy throughout: nothing to report
