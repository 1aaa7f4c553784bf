"""An asyncio event loop on a thread of its own, and coroutines run on it from another.

The scheduler's tick runs here, apart from the gRPC server's loop: on one loop, the
reply to each of the tick's Redis calls was taken only after every report batch queued
before it (hundreds in a burst at 1,000 instances), so the tick's wall time was mostly
other work. On its own loop a reply is taken as soon as the thread gets the interpreter
(``sys.getswitchinterval()`` bounds that wait). State shared with the other loop must be
guarded (``libra/step_lock.py``), and objects bound to a loop (a Redis client's
connections) must be used on the loop they were opened on.

Pure (stdlib only).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# How long ``stop`` waits for the thread to end (its loop ends at its next iteration).
JOIN_TIMEOUT_S = 10.0


class LoopThread:
    """A started thread running ``loop`` until ``stop``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def is_current(self) -> bool:
        """Whether the caller runs on this thread."""
        return threading.current_thread() is self._thread

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and await its result from the caller's loop;
        cancelling the caller cancels it there."""
        if self.is_current():
            return await coro
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        # wrap_future passes a cancellation of the caller on to ``future``, whose
        # cancellation cancels the task on this loop.
        return await asyncio.wrap_future(future)

    def stop(self) -> None:
        """End the loop after the callbacks ready now (tasks still pending are left
        as they are) and wait for the thread."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=JOIN_TIMEOUT_S)
