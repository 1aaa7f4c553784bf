"""Polling helper shared by tests that wait on background tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

# A guard against a hang, not a speed bound: what takes milliseconds on an idle machine
# can take seconds while other suites share its two cores.
DEFAULT_TIMEOUT_S = 60.0


async def wait_until(predicate: Callable[[], Any],
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Poll ``predicate`` (sync or async) until true; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
