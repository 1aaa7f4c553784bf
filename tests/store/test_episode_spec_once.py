"""The agent endpoint reads a job's spec once: ``open_episode`` parses it and hands the
idle timeout to the offer list, and a second open of the same job does not read it again.
Real: Redis (the session's redis-server) and the coordinator's episode store; the clock is
a ``FakeClock`` so offer ages are exact."""

from __future__ import annotations

import pytest

from libra import episodes as ep
from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, NotFound
from libra.jobspec import JobSpec, TaskSpec
from services.coordinator.episode_endpoint import EpisodeEndpoint
from services.coordinator.episode_store import RedisEpisodeStore

JOB = "job-ep"


def offer(episode_id: str, offered_at_ms: int) -> str:
    return ep.encode(ep.EpisodeOffer(episode_id, JOB, "p0", "g0", "2+2?",
                                     offered_at_ms=offered_at_ms))


async def test_offers_older_than_the_idle_timeout_are_skipped(redis) -> None:
    clock = FakeClock()
    now_ms = clock.now_ms()
    await redis.rpush(keys.episode_offers(JOB), offer("stale", now_ms - 10_001),
                      offer("live", now_ms - 9_000))
    got = await RedisEpisodeStore(redis, clock).take_offer(JOB, 1.0, idle_timeout_s=10.0)
    assert got is not None and got.episode_id == "live"


async def test_a_jobs_spec_is_read_once_per_endpoint(redis) -> None:
    spec = JobSpec(task=TaskSpec(agent="arith"))
    await redis.hset(keys.job(JOB), mapping={"spec_json": spec.to_json()})
    endpoint = EpisodeEndpoint(RedisEpisodeStore(redis, FakeClock()), FakeClock())
    with pytest.raises(FailedPrecondition):
        await endpoint.open_episode(JOB, 1.0)
    # The stored spec is gone; the endpoint still knows the job's (immutable) spec.
    await redis.delete(keys.job(JOB))
    with pytest.raises(FailedPrecondition):
        await endpoint.open_episode(JOB, 1.0)


async def test_an_unknown_job_is_not_found(redis) -> None:
    endpoint = EpisodeEndpoint(RedisEpisodeStore(redis, FakeClock()), FakeClock())
    with pytest.raises(NotFound):
        await endpoint.open_episode("no-such-job", 1.0)
