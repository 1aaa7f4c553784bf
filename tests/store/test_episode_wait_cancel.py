"""A cancelled episode wait stops even when redis-py swallowed the cancel (its commands
go through 3.11's wait_for, which drops a cancel landing as the command completes):
the rollout's wait for an agent's next call and the endpoint's wait for an offer. A
test teardown once waited 60 s for an episode task whose cancel was lost, polling for
a call under a clock that never reached the idle deadline. Real: Redis (the session's
redis-server), the rollout's episode channel, the coordinator's episode store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from libra.clock import FakeClock
from services.coordinator.episode_store import RedisEpisodeStore
from services.rollout.episode_channel import RedisEpisodeChannel
from tests.waiting import DEFAULT_TIMEOUT_S

JOB = "job-ep-cancel"


def drop_one_cancel(client: Any) -> tuple[asyncio.Event, Callable[[], None]]:
    """Make ``client.blpop`` lose the first cancel that reaches it (as wait_for does when
    its awaitable finished in the same pass); returns (entered, restore)."""
    real_blpop = client.blpop
    entered = asyncio.Event()
    dropped = False

    async def blpop(*args: Any, **kwargs: Any) -> Any:
        nonlocal dropped
        entered.set()
        try:
            return await real_blpop(*args, **kwargs)
        except asyncio.CancelledError:
            if dropped:
                raise
            dropped = True
            return None

    client.blpop = blpop

    def restore() -> None:
        client.blpop = real_blpop

    return entered, restore


async def cancel_and_wait(wait: Awaitable[Any], entered: asyncio.Event) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(wait)
    await entered.wait()
    task.cancel()
    await asyncio.wait([task], timeout=DEFAULT_TIMEOUT_S)
    return task


async def test_the_rollouts_wait_for_a_call_stops_when_its_cancel_was_swallowed(
        redis_bytes) -> None:
    # The idle deadline is never reached: the clock stands still.
    channel = RedisEpisodeChannel(redis_bytes, FakeClock())
    entered, restore = drop_one_cancel(redis_bytes)
    try:
        task = await cancel_and_wait(channel.next_call("ep-1", timeout_s=30.0), entered)
    finally:
        restore()
    assert task.cancelled()


async def test_the_endpoints_wait_for_an_offer_stops_when_its_cancel_was_swallowed(
        redis) -> None:
    store = RedisEpisodeStore(redis, FakeClock())
    entered, restore = drop_one_cancel(redis)
    try:
        task = await cancel_and_wait(store.take_offer(JOB, wait_s=30.0, idle_timeout_s=30.0),
                                     entered)
    finally:
        restore()
    assert task.cancelled()
