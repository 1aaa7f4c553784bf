"""Which reply answers a call (issue 19). A reply with index 0 comes from an instance
the episode moved to between a call and its turn; a copy of the trajectory placed again
from an older state (its holder lost its lease after a move) also samples a turn at
once, with index 0, before any call reaches it. The endpoint shows the program only a
reply whose prompt extends the tokens its call extends. Real: Redis (the session's
redis-server) and the coordinator's episode store; the test plays the rollout by
pushing replies."""

from __future__ import annotations

from libra import episodes as ep
from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.jobspec import JobSpec, ModelSpec, TaskSpec
from services.coordinator.episode_endpoint import EpisodeEndpoint
from services.coordinator.episode_store import RedisEpisodeStore

JOB = "job-ep"
MODEL = "m"


async def never_gone() -> bool:
    return False


async def reply_with(redis, episode_id: str, *replies: ep.EpisodeReply) -> None:
    await redis.rpush(keys.episode_replies(episode_id), *[ep.encode(r) for r in replies])


async def test_a_reply_sampled_from_an_older_state_is_never_shown(redis) -> None:
    spec = JobSpec(model=ModelSpec(kind="hf", path=f"/models/{MODEL}"),
                   task=TaskSpec(name="calc-words", tool_call_format="hermes", agent="external"))
    await redis.hset(keys.job(JOB), mapping={"spec_json": spec.to_json()})
    await redis.rpush(keys.episode_offers(JOB),
                      ep.encode(ep.EpisodeOffer("ep-1", JOB, "p0", "g0", "hi")))
    endpoint = EpisodeEndpoint(RedisEpisodeStore(redis, FakeClock()), FakeClock())
    grant = await endpoint.open_episode(JOB, 1.0)
    messages = [{"role": "user", "content": "hi"}]
    await reply_with(redis, "ep-1", ep.EpisodeReply(1, content="first", prompt_tokens=40,
                                                    completion_tokens=12))
    _, state, replies = await endpoint.complete(
        grant.api_key, {"model": MODEL, "messages": messages}, never_gone)
    assert [r.content async for r in replies] == ["first"]
    assert state.num_context_tokens == 52
    # The second call extends those 52 tokens. A copy placed again from the state before
    # them answers first (index 0, its prompt 40 tokens): skipped. A reply of index 0
    # whose prompt extends the 52 (a move after the call) answers.
    messages += [{"role": "assistant", "content": "first"}, {"role": "user", "content": "go"}]
    await reply_with(redis, "ep-1",
                     ep.EpisodeReply(0, content="stale", prompt_tokens=40, completion_tokens=9),
                     ep.EpisodeReply(0, content="moved", prompt_tokens=57, completion_tokens=3))
    _, state, replies = await endpoint.complete(
        grant.api_key, {"model": MODEL, "messages": messages}, never_gone)
    assert [r.content async for r in replies] == ["moved"]
    assert state.num_context_tokens == 60
