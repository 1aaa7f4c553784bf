"""The external agent's episode lists in Redis (the rollout's side; see
libra/episodes.py for the records and libra/redis_keys.py for the keys)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from libra import episodes as ep
from libra import redis_keys as keys
from libra.cancellation import raise_if_cancelled

# One blocking read waits at most this long, so a stopping rollout is never stuck on it.
_MAX_BLOCK_S = 1.0

# KEYS[1] = the episode's offered marker, KEYS[2] = the job's offer list;
# ARGV[1] = the offer's JSON, ARGV[2] = the marker's TTL in ms.
# Returns 1 when offered, 0 when the episode was offered before (the marker lives).
# One script, so a retried or repeated offer can never put the episode on the list twice.
_OFFER_ONCE = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
"""


class RedisEpisodeChannel:
    """Offers, calls and replies of the episodes this rollout holds (``redis``: a
    redis.asyncio client; bytes or str replies both work)."""

    def __init__(self, redis: Any, clock: Any) -> None:
        self._r = redis
        self._clock = clock
        self._offer_once = redis.register_script(_OFFER_ONCE)

    async def offer(self, offer: ep.EpisodeOffer, ttl_s: float) -> bool:
        """Offer a trajectory to agent programs, once per episode id (the list lives as
        long as the job; the marker ``ttl_s`` plus the margin, renewed by the endpoint
        while the episode lives). False: it was offered before, nothing written."""
        record = dataclasses.replace(offer, offered_at_ms=self._clock.now_ms())
        ttl_ms = math.ceil(ttl_s * 1000) + keys.EPISODE_TTL_MARGIN_MS
        return bool(await self._offer_once(
            keys=[keys.episode_offered(offer.episode_id), keys.episode_offers(offer.job_id)],
            args=[ep.encode(record), ttl_ms]))

    async def next_call(self, episode_id: str, timeout_s: float,
                        is_left: Callable[[], bool] = lambda: False) -> ep.EpisodeCall | None:
        """The episode's next call, or None after ``timeout_s`` without one, or once
        ``is_left()`` (checked between blocking reads: this rollout no longer holds it)."""
        deadline_s = self._clock.now_s() + timeout_s
        while True:
            # A cancel redis-py swallowed (libra/cancellation.py) would leave this loop
            # polling until the deadline, which a stopping rollout may never reach.
            raise_if_cancelled()
            left_s = deadline_s - self._clock.now_s()
            if left_s <= 0 or is_left():
                return None
            got = await self._r.blpop([keys.episode_calls(episode_id)],
                                      timeout=min(_MAX_BLOCK_S, max(left_s, 0.01)))
            if got is not None:
                return ep.decode(ep.EpisodeCall, got[1])

    async def give_back(self, episode_id: str, call: ep.EpisodeCall, ttl_s: float) -> None:
        """Put a call taken by a rollout that no longer holds the episode back at the
        head of its list, for the one that does (the list's TTL as the endpoint sets it)."""
        key = keys.episode_calls(episode_id)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.lpush(key, ep.encode(call))
            pipe.pexpire(key, math.ceil(ttl_s * 1000) + keys.EPISODE_TTL_MARGIN_MS)
            await pipe.execute()

    async def aborted(self, episode_ids: list[str]) -> dict[str, list[int]]:
        """Episode id -> call indices of the aborts waiting on its call list (one round
        trip for all; the aborts stay there for ``next_call`` to take in order)."""
        async with self._r.pipeline(transaction=False) as pipe:
            for episode_id in episode_ids:
                pipe.lrange(keys.episode_calls(episode_id), 0, -1)
            lists = await pipe.execute()
        out: dict[str, list[int]] = {}
        for episode_id, items in zip(episode_ids, lists, strict=True):
            calls = [ep.decode(ep.EpisodeCall, item) for item in items]
            if any(call.kind == ep.ABORT for call in calls):
                out[episode_id] = [c.call_index for c in calls if c.kind == ep.ABORT]
        return out

    async def reply(self, episode_id: str, reply: ep.EpisodeReply, ttl_s: float) -> None:
        key = keys.episode_replies(episode_id)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.rpush(key, ep.encode(reply))
            pipe.pexpire(key, math.ceil(ttl_s * 1000) + keys.EPISODE_TTL_MARGIN_MS)
            await pipe.execute()

    async def count(self, job_id: str, name: str) -> None:
        await self._r.hincrby(keys.counters(job_id), name, 1)

