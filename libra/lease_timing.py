"""When a lease holder renews: every third of its TTL, and soon again after a failure.

A lease lives in Redis until its TTL runs out by Redis's clock, whatever its holder
does, so "no lease expires while its holder is alive" holds only when a renewal lands
before that. Renewing every third of the TTL leaves two thirds of it for one renewal to
land. What used to spend that margin: after a failed renewal (the coordinator
restarting, its Redis stalled past its retries) the holder waited a whole period before
the next try, so two failures in a row lost the lease even when the coordinator came
back a moment after the second. Now a failed renewal is tried again after a short wait
doubling from ``RETRY_FIRST_S`` up to a sixth of the TTL: a stall that ends while the
lease still lives is followed by a renewal within a sixth of the TTL.

The period counts from the start of the last attempt, not its end: a renewal that took
seconds (a coordinator catching up) does not push the next one back by as much.

A renewal's own deadline is bounded by the lease too (``renewal_deadline_s``): half the
time the lease has left. With the client's default deadline (10 s) a renewal stuck on a
coordinator that takes the call and never answers held the retry back past the end of
a 3 s lease; at half, the call fails while the other half is left for a retry.

What this cannot help: a stall longer than the time the lease has left (up to two thirds
of its TTL), or a host whose wall clock jumps forward (Redis expires keys by it), which
the coordinator's TTL floor (``lease_renewals_per_s``) and a longer asked TTL widen.
"""

from __future__ import annotations

RETRY_FIRST_S = 0.25
"""The first wait after a failed renewal (then doubling, at most a sixth of the TTL)."""

RENEWAL_DEADLINE_MIN_S = 0.2
"""The shortest deadline a renewal gets, however little the lease has left: below it
even a coordinator that answers at once (a loaded host, a round trip across racks)
would miss it, and a renewal that cannot land is no use."""


def renewal_wait_s(ttl_ms: int, num_failed: int, elapsed_s: float = 0.0) -> float:
    """Seconds to wait before the next renewal attempt.

    Args:
        ttl_ms: the lease's granted TTL.
        num_failed: failed attempts since the last answered one (0: it was answered).
        elapsed_s: how long ago the last attempt started.
    """
    period_s = ttl_ms / 3000.0
    if num_failed > 0:
        period_s = min(RETRY_FIRST_S * 2 ** min(num_failed - 1, 16), period_s / 2)
    return max(0.0, period_s - elapsed_s)


def renewal_deadline_s(ttl_ms: int, since_renewed_s: float) -> float:
    """Seconds one renewal call may take: half the time the lease has left (at least
    ``RENEWAL_DEADLINE_MIN_S``), so that a call that gets no answer fails in time for
    a retry while the lease still lives.

    Args:
        ttl_ms: the lease's granted TTL.
        since_renewed_s: how long ago the last answered renewal (or the grant) was asked
            for; the coordinator renewed after that, so the lease lives at least
            ``ttl_ms`` from then.
    """
    left_s = ttl_ms / 1000.0 - since_renewed_s
    return max(RENEWAL_DEADLINE_MIN_S, left_s / 2)
