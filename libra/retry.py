"""Retry with backoff for calls that are safe to repeat, across a peer's outage.

The typed clients (``libra.clients.base``) retry an idempotent RPC a few times within
a fraction of a second: that rides out a dropped connection, not a restart. A peer
process that dies and is restarted by the supervisor is gone for seconds. Callers
whose work must not fail because of that (the trainer's step and job-done reports)
wrap the call in :func:`retry_transient`, which keeps trying while the error is
retryable (``LibraError.retryable``: Unavailable, DeadlineExceeded, ResourceExhausted)
until ``policy.give_up_after_s`` has passed, then raises the last error.

Pure: time comes from an injected :class:`Clock` and waiting from an injected
``sleep``, so tests run the whole backoff without waiting (``FakeSleep``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from libra.clock import Clock
from libra.errors import LibraError

logger = logging.getLogger(__name__)
R = TypeVar("R")
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Exponential backoff between tries, capped, for at most ``give_up_after_s``."""

    first_delay_s: float = 0.1
    """Wait after the first failure; doubles after each further failure."""
    max_delay_s: float = 2.0
    """Cap of the wait between tries: once the peer is back, the call goes through
    within this long (plus the channel's reconnect delay)."""
    give_up_after_s: float = 600.0
    """Stop trying this long after the first failure and raise the last error."""

    def __post_init__(self) -> None:
        if not 0 < self.first_delay_s <= self.max_delay_s:
            raise ValueError(f"need 0 < first_delay_s <= max_delay_s, got "
                             f"{self.first_delay_s} and {self.max_delay_s}")
        if self.give_up_after_s < 0:
            raise ValueError(f"give_up_after_s must be >= 0, got {self.give_up_after_s}")


async def retry_transient(what: str, call: Callable[[], Awaitable[R]], policy: RetryPolicy,
                          clock: Clock, sleep: Sleep = asyncio.sleep) -> R:
    """``call()`` until it succeeds, a non-retryable error occurs, or time runs out.

    Only for calls that are safe to repeat after an unknown outcome (idempotent, or
    carrying an idempotency key). The first failure is logged as a warning, later
    ones at debug level, and the recovery once more as a warning: an outage of a
    minute writes three lines, not sixty.
    """
    delay_s = policy.first_delay_s
    first_failure_s: float | None = None
    num_failures = 0
    while True:
        try:
            result = await call()
        except LibraError as exc:
            if not exc.retryable:
                raise
            now_s = clock.now_s()
            first_failure_s = now_s if first_failure_s is None else first_failure_s
            num_failures += 1
            if now_s - first_failure_s >= policy.give_up_after_s:
                logger.error("[retry] %s gave up after %d tries in %.1fs error=%s", what,
                             num_failures, now_s - first_failure_s, exc)
                raise
            log = logger.warning if num_failures == 1 else logger.debug
            log("[retry] %s failed try=%d error=%s; retrying with backoff up to %.1fs",
                what, num_failures, exc, policy.max_delay_s)
            await sleep(delay_s)
            delay_s = min(delay_s * 2, policy.max_delay_s)
            continue
        if num_failures:
            logger.warning("[retry] %s succeeded after %d failed tries", what, num_failures)
        return result
