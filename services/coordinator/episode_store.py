"""The agent endpoint's episodes in Redis (the coordinator's side of the lists the
external agent reads; records: libra/episodes.py, keys: libra/redis_keys.py)."""

from __future__ import annotations

import math
from typing import Any

from libra import episodes as ep
from libra import redis_keys as keys
from libra.cancellation import raise_if_cancelled

# Below the coordinator client's 2 s socket timeout, which a blocking read must not hit.
_MAX_BLOCK_S = 0.5


def _ttl_ms(state: ep.EpisodeState) -> int:
    return math.ceil(state.idle_timeout_s * 1000) + keys.EPISODE_TTL_MARGIN_MS


class RedisEpisodeStore:
    """``redis``: a redis.asyncio client (the coordinator's, str replies)."""

    def __init__(self, redis: Any, clock: Any) -> None:
        self._r = redis
        self._clock = clock

    async def job_spec_json(self, job_id: str) -> str | None:
        value = await self._r.hget(keys.job(job_id), "spec_json")
        return value.decode() if isinstance(value, bytes) else value

    async def take_offer(self, job_id: str, wait_s: float,
                         idle_timeout_s: float) -> ep.EpisodeOffer | None:
        """The oldest live offer; offers older than ``idle_timeout_s`` (the job's
        ``task.episode_idle_timeout_s``), whose rollout has given up waiting, are skipped
        (their trajectory already failed as timed out)."""
        deadline_s = self._clock.now_s() + wait_s
        while (left_s := deadline_s - self._clock.now_s()) > 0:
            raise_if_cancelled()  # a cancel redis-py swallowed (libra/cancellation.py)
            got = await self._r.blpop([keys.episode_offers(job_id)],
                                      timeout=min(_MAX_BLOCK_S, max(left_s, 0.01)))
            if got is None:
                continue
            offer = ep.decode(ep.EpisodeOffer, got[1])
            if self._is_live(offer, idle_timeout_s):
                return offer
        return None

    def _is_live(self, offer: ep.EpisodeOffer, idle_timeout_s: float) -> bool:
        if not offer.offered_at_ms:
            return True
        return self._clock.now_ms() < offer.offered_at_ms + idle_timeout_s * 1000

    async def save(self, state: ep.EpisodeState) -> None:
        ttl_ms = _ttl_ms(state)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.set(keys.episode(state.episode_id), ep.encode(state), px=ttl_ms)
            pipe.set(keys.episode_key(state.key_sha256), state.episode_id, px=ttl_ms)
            # The episode stays offered (never offered again) as long as it lives.
            pipe.pexpire(keys.episode_offered(state.episode_id), ttl_ms)
            await pipe.execute()

    async def load(self, episode_id: str) -> ep.EpisodeState | None:
        data = await self._r.get(keys.episode(episode_id))
        return None if data is None else ep.decode(ep.EpisodeState, data)

    async def episode_of_key(self, key_sha256: str) -> str | None:
        value = await self._r.get(keys.episode_key(key_sha256))
        return value.decode() if isinstance(value, bytes) else value

    async def push_call(self, state: ep.EpisodeState, call: ep.EpisodeCall) -> None:
        key = keys.episode_calls(state.episode_id)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.rpush(key, ep.encode(call))
            pipe.pexpire(key, _ttl_ms(state))
            pipe.pexpire(keys.episode_offered(state.episode_id), _ttl_ms(state))
            await pipe.execute()

    async def pop_reply(self, episode_id: str, timeout_s: float) -> ep.EpisodeReply | None:
        got = await self._r.blpop([keys.episode_replies(episode_id)],
                                  timeout=min(_MAX_BLOCK_S, max(timeout_s, 0.01)))
        return None if got is None else ep.decode(ep.EpisodeReply, got[1])

    async def forget(self, state: ep.EpisodeState) -> None:
        """The key and the state go now; the call list stays (the rollout still reads
        the close from it) and expires by its TTL."""
        await self._r.delete(keys.episode_key(state.key_sha256), keys.episode(state.episode_id),
                             keys.episode_replies(state.episode_id))

    async def count(self, job_id: str, name: str) -> None:
        await self._r.hincrby(keys.counters(job_id), name, 1)
