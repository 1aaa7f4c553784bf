"""The agent endpoint reads a key's episode from Redis once, and the state read of every
call still decides whether the key is valid: a closed or expired episode's key, or the
key of an earlier opening of the same episode, is refused. Real: Redis (the session's
redis-server) and the coordinator's episode store."""

from __future__ import annotations

import pytest

from libra import episodes as ep
from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.errors import Unauthenticated
from libra.jobspec import JobSpec, ModelSpec, TaskSpec
from services.coordinator.episode_endpoint import EpisodeEndpoint, key_digest
from services.coordinator.episode_store import RedisEpisodeStore

JOB = "job-keys"


async def opened(redis, endpoint: EpisodeEndpoint, clock: FakeClock,
                 episode_id: str = "ep-1") -> ep.EpisodeGrant:
    await redis.rpush(keys.episode_offers(JOB), ep.encode(ep.EpisodeOffer(
        episode_id, JOB, "p0", "g0", "2+2?", offered_at_ms=clock.now_ms())))
    return await endpoint.open_episode(JOB, 1.0)


@pytest.fixture
async def endpoint(redis) -> tuple[EpisodeEndpoint, FakeClock]:
    spec = JobSpec(model=ModelSpec(kind="hf", path="/models/m"),
                   task=TaskSpec(name="calc-words", tool_call_format="hermes",
                                 agent="external"))
    await redis.hset(keys.job(JOB), mapping={"spec_json": spec.to_json()})
    clock = FakeClock()
    return EpisodeEndpoint(RedisEpisodeStore(redis, clock), clock), clock


async def test_a_keys_episode_is_read_once_and_its_state_still_decides(redis,
                                                                       endpoint) -> None:
    endpoint, clock = endpoint
    grant = await opened(redis, endpoint, clock)
    assert (await endpoint.authenticate(grant.api_key)).episode_id == "ep-1"
    # The key's entry is gone (read once already): the endpoint still knows its episode.
    await redis.delete(keys.episode_key(key_digest(grant.api_key)))
    assert (await endpoint.authenticate(grant.api_key)).episode_id == "ep-1"
    await redis.delete(keys.episode("ep-1"))  # expired: the state decides
    with pytest.raises(Unauthenticated):
        await endpoint.authenticate(grant.api_key)


async def test_the_key_of_an_earlier_opening_is_refused(redis, endpoint) -> None:
    endpoint, clock = endpoint
    first = await opened(redis, endpoint, clock)
    await endpoint.authenticate(first.api_key)  # known to the endpoint now
    second = await opened(redis, endpoint, clock)  # the same episode offered again
    assert second.episode_id == first.episode_id
    with pytest.raises(Unauthenticated):
        await endpoint.authenticate(first.api_key)
    assert (await endpoint.authenticate(second.api_key)).episode_id == "ep-1"


async def test_a_closed_episodes_key_is_refused(redis, endpoint) -> None:
    endpoint, clock = endpoint
    grant = await opened(redis, endpoint, clock)
    await endpoint.close("ep-1", grant.api_key, 1.0)
    with pytest.raises(Unauthenticated):
        await endpoint.authenticate(grant.api_key)
