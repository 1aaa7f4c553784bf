"""One program per episode, at the Redis lists (issue 19): the rollout offers an episode
once per id, the endpoint keeps it offered while it lives, a call taken by a rollout
that no longer holds the episode goes back to the head of its list, and a wait ends
once the episode left. Real: Redis (the session's redis-server, bytes-mode client as the
rollout uses), the rollout's episode channel and the coordinator's episode store."""

from __future__ import annotations

from libra import episodes as ep
from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.jobspec import JobSpec, ModelSpec, TaskSpec
from services.coordinator.episode_endpoint import EpisodeEndpoint
from services.coordinator.episode_store import RedisEpisodeStore
from services.rollout.episode_channel import RedisEpisodeChannel

JOB = "job-ep"
IDLE_TIMEOUT_S = 30.0


def offer(episode_id: str = "ep-1") -> ep.EpisodeOffer:
    return ep.EpisodeOffer(episode_id, JOB, "p0", "g0", "2+2?")


async def test_an_episode_is_offered_once_per_id(redis_bytes) -> None:
    channel = RedisEpisodeChannel(redis_bytes, FakeClock())
    assert await channel.offer(offer(), IDLE_TIMEOUT_S) is True
    # Placed again (a lease lapse, a restart) or the offer retried: nothing is written.
    assert await channel.offer(offer(), IDLE_TIMEOUT_S) is False
    assert await channel.offer(offer("ep-2"), IDLE_TIMEOUT_S) is True
    offered = [ep.decode(ep.EpisodeOffer, raw).episode_id
               for raw in await redis_bytes.lrange(keys.episode_offers(JOB), 0, -1)]
    assert offered == ["ep-1", "ep-2"]
    ttl_ms = await redis_bytes.pttl(keys.episode_offered("ep-1"))
    assert IDLE_TIMEOUT_S * 1000 < ttl_ms <= IDLE_TIMEOUT_S * 1000 + keys.EPISODE_TTL_MARGIN_MS


async def test_an_open_episode_stays_offered_while_it_lives_and_after_its_close(
        redis, redis_bytes) -> None:
    spec = JobSpec(model=ModelSpec(kind="hf", path="/models/m"),
                   task=TaskSpec(name="calc-words", tool_call_format="hermes", agent="external",
                                 episode_idle_timeout_s=IDLE_TIMEOUT_S))
    await redis.hset(keys.job(JOB), mapping={"spec_json": spec.to_json()})
    assert await RedisEpisodeChannel(redis_bytes, FakeClock()).offer(offer(), IDLE_TIMEOUT_S)
    marker = keys.episode_offered("ep-1")
    await redis.pexpire(marker, 1000)  # as if the offer had waited long
    endpoint = EpisodeEndpoint(RedisEpisodeStore(redis, FakeClock()), FakeClock())
    grant = await endpoint.open_episode(JOB, 1.0)
    assert await redis.pttl(marker) > 1000  # renewed with the episode's state
    await endpoint.close(grant.episode_id, grant.api_key, 1.0)
    # The close is read by whichever copy holds the trajectory; never offered again.
    assert await redis.exists(marker)


async def test_a_call_given_back_is_read_again_first(redis_bytes) -> None:
    channel = RedisEpisodeChannel(redis_bytes, FakeClock())
    for index in (1, 2):
        await redis_bytes.rpush(keys.episode_calls("ep-1"),
                                ep.encode(ep.EpisodeCall(ep.CALL, index)))
    taken = await channel.next_call("ep-1", 1.0)
    assert taken is not None and taken.call_index == 1
    await channel.give_back("ep-1", taken, IDLE_TIMEOUT_S)
    assert await redis_bytes.pttl(keys.episode_calls("ep-1")) > 0  # never left without TTL
    again = [await channel.next_call("ep-1", 1.0) for _ in range(2)]
    assert [call.call_index for call in again if call is not None] == [1, 2]


async def test_a_wait_for_a_call_ends_once_the_episode_left(redis_bytes) -> None:
    # The clock stands still: only is_left can end this wait (a timeout never comes).
    channel = RedisEpisodeChannel(redis_bytes, FakeClock())
    reads = []

    def is_left() -> bool:
        reads.append(1)
        return len(reads) > 1  # left after the first blocking read

    assert await channel.next_call("ep-1", 3600.0, is_left) is None
    assert len(reads) == 2
