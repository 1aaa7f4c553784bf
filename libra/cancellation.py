"""Stopping a cancelled loop even when a library swallowed the cancel.

On Python 3.11 ``asyncio.wait_for`` returns its awaitable's result, dropping the
``CancelledError``, when a cancel lands in the same pass as the awaitable finishing
(CPython gh-86296, fixed in 3.12). Libra's own code does not use it (ruff bans it), but
redis-py's asyncio connection sends every command through it whenever a socket timeout
is set, and redis-py 8 sets one (5 s) by default. A rollout loop cancelled while a
command was being sent went on running: the request stayed counted in
``Task.cancelling()`` but was never delivered again, and a test teardown waited for it
for 300 s. Loops that live as long as their service check at each pass.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger(__name__)
# How long a stopping task gets after a cancel before it is cancelled again.
CANCEL_RETRY_S = 1.0


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if this task was asked to stop and is still running.

    A cancel that reached the task is cleared by ``uncancel()`` (``asyncio.timeout``
    does so for its own); one that is still counted was swallowed on the way. Call it
    at the top of each pass of a long-lived loop, outside any ``asyncio.timeout`` block.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError("cancelled earlier (the cancel was swallowed below)")


async def stop_task(task: asyncio.Task[object], retry_s: float = CANCEL_RETRY_S) -> None:
    """Cancel ``task`` and wait until it ends, cancelling it again every ``retry_s``
    while it runs; its result or error is dropped.

    One cancel is not always enough: a loop without ``raise_if_cancelled`` whose cancel
    is swallowed below it runs on, and a service's shutdown that awaited it never
    ended (the coordinator outlived its SIGTERM, seen once in CI). The repeat is the
    backstop; the loops' own checks are the fix.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
        if not task.done():
            logger.warning("[shutdown] task=%s still running %.1f s after a cancel (the "
                           "cancel was swallowed); cancelling again", task.get_name(), retry_s)
    if not task.cancelled():
        task.exception()  # retrieved: a loop's failure at shutdown is not news
