"""An episode dropped by its rollout instance (its lease was lost, issue 19): the wait
for the program's next call ends, a call taken meanwhile goes back to the head of the
episode's call list for the trajectory's new holder, and a copy placed here again
starts from fresh per-episode state.

Real: the external agent over the tiny Qwen2 fixture's chat template, the Redis episode
channel on the session's redis-server (bytes client, as the rollout's). The test plays
the endpoint by pushing calls."""

from __future__ import annotations

import asyncio

import pytest

from libra import episodes as ep
from libra import redis_keys as keys
from libra.clock import FakeClock
from libra.models.hf import load_tokenizer
from services.rollout.agent import TurnOutcome
from services.rollout.agent_registry import build_agent_or_stand_in
from services.rollout.backend import HfTokenizer
from services.rollout.episode_channel import RedisEpisodeChannel
from services.rollout.external_agent import EpisodeLeft, ExternalAgent
from tests.unit.rollout.rig import make_task
from tests.unit.rollout.test_rollout_batch_window import external_spec
from tests.waiting import wait_until


async def blocked_reads(redis) -> int:
    return int((await redis.info("clients"))["blocked_clients"])


async def test_a_dropped_episode_stops_waiting_and_its_call_goes_to_the_new_holder(
        redis_bytes, hf_model_dir) -> None:
    model_dir = hf_model_dir("qwen2")
    hf = load_tokenizer(str(model_dir))
    spec = external_spec(model_dir, window_ms=0.0)
    agent = build_agent_or_stand_in(spec, HfTokenizer(hf, [hf.eos_token_id], 400))
    assert isinstance(agent, ExternalAgent)
    # The idle timer stands still: only the drop can end this wait.
    agent.attach(RedisEpisodeChannel(redis_bytes, FakeClock()))
    traj = make_task(0)
    traj.token_ids = [1, 2, 3]  # held here, waiting for its program's next call
    waiting = asyncio.create_task(agent.run_turn(spec, traj, TurnOutcome()))
    await wait_until(lambda: _blocked(redis_bytes))  # its blocking read is in Redis
    # Lease lost: dropped here; the program's next call arrives during that read.
    agent.drop([traj.trajectory_id])
    call = ep.EpisodeCall(ep.CALL, 2, messages_json='[{"role": "user", "content": "go"}]',
                          num_context_tokens=3)
    await redis_bytes.rpush(keys.episode_calls(traj.trajectory_id), ep.encode(call))
    with pytest.raises(EpisodeLeft):
        await waiting
    left = await redis_bytes.lrange(keys.episode_calls(traj.trajectory_id), 0, -1)
    assert [ep.decode(ep.EpisodeCall, raw) for raw in left] == [call]
    # A copy placed here again takes that call with its own state (no leftovers).
    again = make_task(0)
    again.token_ids = [1, 2, 3]
    results = await agent.run_turn(spec, again, TurnOutcome())
    assert [r.name for r in results] == ["user"]


async def _blocked(redis) -> bool:
    return await blocked_reads(redis) >= 1
