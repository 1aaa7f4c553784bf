"""One program per episode (issue 19): an episode whose trajectory is placed again.

The rollout instance holding the episode loses its lease (a renewal late under load),
drops its work and registers anew; the scheduler places the trajectory again from its
task, as first placed (no tokens), here again or on another instance. The episode is
never offered a second time, so no second program can open it: the program that opened
it goes on, its next call that extends tokens the new copy does not hold comes again
whole (a resync, counted), and the old copy stops waiting (a call it took goes back).
An episode closed before any sampled turn is dropped and counted, never trained.
The stack: agent_stack.py (real endpoint, openai client, Redis; the rig's fakes).
"""

from __future__ import annotations

from typing import Any

import pytest

from libra import redis_keys as keys
from libra import types as t
from services.rollout.finisher import UNSAMPLED_COUNTER, UNSAMPLED_REASON
from tests.fakes.engine import FakeEngine
from tests.service.coordinator.agent_stack import (
    TOOLS,
    Stack,
    answer_the_tool_call,
    call_text,
    instance_there,
)
from tests.unit.rollout.rig import HERE, JOB, THERE, make_task
from tests.waiting import wait_until

WHEN = ("before it was opened", "before its first call", "between two calls")
FIRST_TURN, LAST_TURN = call_text("6*7"), "It is 42.<|im_end|>"


async def lose_lease_and_place_again(stack: Stack, where: str) -> None:
    """The lease lapses: this instance drops the episode and registers anew; the
    scheduler places the trajectory again, from its task (as first placed)."""
    rig = stack.rig
    registered = len(rig.coordinator.acquired)
    rig.coordinator.lose_lease_times = 1
    await wait_until(lambda: len(rig.coordinator.acquired) > registered)
    assert rig.core.num_active == 0
    await rig.place(make_task(0), instance=where)


async def num_offers(stack: Stack) -> int:
    return await stack.rig.world.r.llen(keys.episode_offers(JOB))


@pytest.mark.parametrize("where", [HERE, THERE])
@pytest.mark.parametrize("when", WHEN)
async def test_an_episode_placed_again_goes_on_with_the_one_program_that_opened_it(
        stack: Stack, when: str, where: str) -> None:
    rig = stack.rig
    rig.coordinator.grant_ttl_ms = 30  # renewals every 10 ms: the lapse is seen at once
    await rig.core.register()
    there_engine = FakeEngine(stack.tokenizer)
    engine = rig.engine if where == HERE else there_engine
    if when == "between two calls":
        rig.engine.queue(FIRST_TURN)
        engine.queue(LAST_TURN)
    else:
        engine.queue(FIRST_TURN, LAST_TURN)
    async with instance_there(stack, there_engine):
        await rig.place(make_task(0))
        rig.start()
        await wait_until(lambda: _offered(stack))
        episode = None if when == "before it was opened" else await stack.open()
        messages: list[dict[str, Any]] = [{"role": "user", "content": "6*7?"}]
        first = None
        if when == "between two calls":
            first = await stack.client(episode).chat.completions.create(  # type: ignore[arg-type]
                model=stack.model, messages=messages, tools=TOOLS)
        await lose_lease_and_place_again(stack, where)
        episode = episode or await stack.open()
        client = stack.client(episode)
        if first is None:
            first = await client.chat.completions.create(model=stack.model, messages=messages,
                                                         tools=TOOLS)
        second = await answer_the_tool_call(stack, client, messages, first)
        assert second.choices[0].message.content == "It is 42."
        # Offered once: no second program can open it.
        assert await num_offers(stack) == 0
        again = await stack.http.post(f"{stack.base_url}/v1/episodes",
                                      json={"job_id": JOB, "wait_s": 1})
        assert again.status_code == 503, again.text
        assert (await stack.close(episode, {"reward": 1.0})).status_code == 200
        (traj,) = await rig.run_until_published(1)
    assert traj.status is t.TrajectoryStatus.FINISHED and traj.reward == 1.0
    assert traj.instance_id == where and traj.check_aligned() is None
    assert traj.segments == []  # the copy dropped had nothing this one could keep
    # Each turn the program read was sampled once, the last one by the new copy.
    assert len(rig.engine.requests) + len(there_engine.requests) == 2
    last_prompt = engine.requests[-1].prompt_token_ids
    assert traj.token_ids[:len(last_prompt)] == last_prompt
    assert sum(traj.loss_mask) > 0
    prompt = stack.tokenizer.tokenizer.decode(traj.token_ids[:traj.num_prompt_tokens])
    assert "6*7?" in prompt  # the program's own conversation
    assert ("<tool_response>" in prompt) is (when == "between two calls")  # resent whole
    assert await stack.counter("episode_resyncs") == (when == "between two calls")
    assert await stack.counter("episodes_placed_again") == 1
    assert await stack.counter("episodes_timed_out") == 0


async def _offered(stack: Stack) -> bool:
    return await stack.rig.world.r.exists(keys.episode_offered("tr-0")) == 1


async def test_an_episode_closed_before_any_sampled_turn_is_dropped_and_counted(
        stack: Stack) -> None:
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    assert (await stack.close(episode, {"reward": 1.0})).status_code == 200
    (traj,) = await stack.rig.run_until_published(1)
    assert traj.status is t.TrajectoryStatus.FAILED  # the trainer drops it
    assert traj.failure_reason == UNSAMPLED_REASON
    assert await stack.counter(UNSAMPLED_COUNTER) == 1
    assert stack.rig.engine.requests == []
