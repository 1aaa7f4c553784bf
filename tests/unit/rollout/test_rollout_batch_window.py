"""The batching window in the rollout loop (services/rollout/batch_window.py): external
agents' calls that arrive while it is open share one engine call; it closes at its cap
even while calls are still expected; internal agents never open it.

Real: the rollout core and the external agent over the tiny Qwen2 fixture's chat
template, the Redis episode channel on the session's redis-server; the test plays the
endpoint by pushing each episode's calls on its call list. The window runs on the rig's
FakeClock, which only the test moves: whether it is open never depends on the machine's
speed. Fakes: the rig's (tests/unit/rollout/rig.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from libra import episodes as ep
from libra import redis_keys as keys
from libra import types as t
from libra.clock import FakeClock
from libra.jobspec import JobSpec, ModelSpec, TaskSpec, ToolSchema, ToolsSpec
from libra.models.hf import load_tokenizer
from services.rollout.backend import HfTokenizer
from services.rollout.episode_channel import RedisEpisodeChannel
from tests.unit.rollout.rig import Rig, make_task, started_rig
from tests.waiting import wait_until

CAP_MS = 50.0  # never reached: the fake clock stands still
SCHEMA = json.dumps({"type": "object", "properties": {"expression": {"type": "string"}}})
WAIT_S = 30.0  # for the loop to catch up (2 shared cores): never part of what is tested


def external_spec(model_dir: Path, window_ms: float) -> JobSpec:
    return JobSpec(
        model=ModelSpec(kind="hf", path=str(model_dir)),
        task=TaskSpec(name="calc-words", max_turns=4, max_new_tokens_per_turn=64,
                      tool_call_format="hermes", agent="external",
                      episode_batch_window_ms=window_ms),
        tools=ToolsSpec(schemas=[ToolSchema(name="calculator", description="Evaluate.",
                                            parameters_json=SCHEMA)]))


@asynccontextmanager
async def episodes_rig(tmp_path: Path, redis: Any, model_dir: Path, window_ms: float,
                       num_episodes: int) -> AsyncIterator[Rig]:
    """A running rig whose ``num_episodes`` episodes all await their first call."""
    hf = load_tokenizer(str(model_dir))
    tokenizer = HfTokenizer(hf, [hf.eos_token_id], 400)
    # The episodes' idle timer stands still (its own clock): none times out.
    async with started_rig(tmp_path, redis=redis, spec=external_spec(model_dir, window_ms),
                           tokenizer=tokenizer,
                           episodes=RedisEpisodeChannel(redis, FakeClock())) as rig:
        for index in range(num_episodes):
            await rig.place(make_task(index))
        rig.start()
        await wait_until(lambda: rig.core.window.num_awaiting == num_episodes, WAIT_S)
        try:
            yield rig
        finally:
            for index in range(num_episodes):  # end the episodes still open
                await push(redis, index, ep.EpisodeCall(kind=ep.CLOSE, call_index=9,
                                                        has_reward=True, reward=0.0))
            await rig.run_until_published(num_episodes)


async def push(redis: Any, index: int, call: ep.EpisodeCall) -> None:
    await redis.rpush(keys.episode_calls(make_task(index).trajectory_id), ep.encode(call))


async def first_call(rig: Rig, redis: Any, index: int) -> None:
    """Episode ``index``'s first call, pushed and taken (its trajectory is then ready)."""
    before = rig.core.window.num_arrivals
    await push(redis, index, ep.EpisodeCall(
        kind=ep.CALL, call_index=1, is_whole=True,
        messages_json=json.dumps([{"role": "user", "content": f"{index}+1?"}])))
    await wait_until(lambda: rig.core.window.num_arrivals == before + 1, WAIT_S)


async def test_calls_arriving_within_the_window_share_one_engine_call(
        tmp_path, redis_bytes, hf_model_dir) -> None:
    async with episodes_rig(tmp_path, redis_bytes, hf_model_dir("qwen2"), CAP_MS, 3) as rig:
        await first_call(rig, redis_bytes, 0)
        await wait_until(lambda: rig.core.window.opened_s is not None, WAIT_S)
        await first_call(rig, redis_bytes, 1)
        await first_call(rig, redis_bytes, 2)  # the last awaited call: the window closes
        await wait_until(lambda: rig.engine.batch_sizes, WAIT_S)
        assert rig.engine.batch_sizes == [3]
        assert rig.core.window.num_waits == 1 and rig.core.window.waited_s == 0.0


async def test_without_a_window_the_first_call_steps_alone(
        tmp_path, redis_bytes, hf_model_dir) -> None:
    async with episodes_rig(tmp_path, redis_bytes, hf_model_dir("qwen2"), 0.0, 3) as rig:
        await first_call(rig, redis_bytes, 0)
        await wait_until(lambda: rig.engine.batch_sizes, WAIT_S)
        await first_call(rig, redis_bytes, 1)
        await first_call(rig, redis_bytes, 2)
        await wait_until(lambda: sum(rig.engine.batch_sizes) == 3, WAIT_S)
        assert rig.engine.batch_sizes[0] == 1
        assert rig.core.window.num_waits == 0


async def test_the_window_closes_at_its_cap_while_calls_are_still_expected(
        tmp_path, redis_bytes, hf_model_dir) -> None:
    gap_s = 1 / 128  # exact in binary: the fake clock lands on the cap, not beside it
    cap_ms = 5 * gap_s * 1000
    async with episodes_rig(tmp_path, redis_bytes, hf_model_dir("qwen2"), cap_ms, 8) as rig:
        window = rig.core.window
        window.mean_round_trip_s = 1.0  # as measured before: every awaited call is due
        await first_call(rig, redis_bytes, 0)
        await wait_until(lambda: window.opened_s is not None, WAIT_S)
        opened_s = window.opened_s
        for index in range(1, 5):
            rig.clock.advance(gap_s)
            await first_call(rig, redis_bytes, index)
        assert rig.engine.batch_sizes == [] and window.opened_s == opened_s
        rig.clock.advance(gap_s)  # the cap since it opened; 3 calls still expected
        await wait_until(lambda: rig.engine.batch_sizes, WAIT_S)
        assert rig.engine.batch_sizes == [5]
        assert window.longest_wait_s == cap_ms / 1000


async def test_internal_agents_never_open_the_window(tmp_path) -> None:
    # The default (arith) agent with the largest cap: a wait would last the fake
    # clock's 1 s, which never passes, so a second trajectory steps only if none opens
    # while the first one's tool call is in flight.
    spec = JobSpec(task=TaskSpec(max_turns=4, episode_batch_window_ms=1000.0),
                   tools=ToolsSpec(call_timeout_s=5.0))
    async with started_rig(tmp_path, spec=spec) as rig:
        rig.tools.gate = asyncio.Event()  # tool calls wait until the test opens it
        rig.engine.queue("<calc>1+2</calc>", "<ans>4</ans>", "<ans>3</ans>")
        await rig.place(make_task(0))
        rig.start()
        await wait_until(lambda: rig.engine.batch_sizes == [1], WAIT_S)
        await rig.place(make_task(1))  # ready while tr-0's tool call is held
        await wait_until(lambda: rig.engine.batch_sizes == [1, 1], WAIT_S)
        rig.tools.gate.set()
        trajs = await rig.run_until_published(2)
    assert [tr.status for tr in trajs] == [t.TrajectoryStatus.FINISHED] * 2
    assert rig.core.window.num_waits == 0
