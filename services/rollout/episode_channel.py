"""The external agent's episode lists in Redis (the rollout's side; see
libra/episodes.py for the records and libra/redis_keys.py for the keys)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from libra import episodes as ep
from libra import redis_keys as keys

# One blocking read waits at most this long, so a stopping rollout is never stuck on it.
_MAX_BLOCK_S = 1.0


class RedisEpisodeChannel:
    """Offers, calls and replies of the episodes this rollout holds (``redis``: a
    redis.asyncio client; bytes or str replies both work)."""

    def __init__(self, redis: Any, clock: Any) -> None:
        self._r = redis
        self._clock = clock

    async def offer(self, offer: ep.EpisodeOffer) -> None:
        """Offer a trajectory to agent programs (the list lives as long as the job)."""
        record = dataclasses.replace(offer, offered_at_ms=self._clock.now_ms())
        await self._r.rpush(keys.episode_offers(offer.job_id), ep.encode(record))

    async def next_call(self, episode_id: str, timeout_s: float) -> ep.EpisodeCall | None:
        """The episode's next call, or None after ``timeout_s`` without one."""
        deadline_s = self._clock.now_s() + timeout_s
        while True:
            left_s = deadline_s - self._clock.now_s()
            if left_s <= 0:
                return None
            got = await self._r.blpop([keys.episode_calls(episode_id)],
                                      timeout=min(_MAX_BLOCK_S, max(left_s, 0.01)))
            if got is not None:
                return ep.decode(ep.EpisodeCall, got[1])

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

