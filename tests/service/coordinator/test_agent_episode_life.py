"""An agent endpoint episode's life beyond its calls: idle timeouts, clients gone
mid-call (the engine row stopped, nothing leaked), one call at a time, a move between
buckets, max_turns, and the `libra agent run` driver. The stack: agent_stack.py.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from libra import types as t
from libra_cli.agent import Driver
from tests.fakes.engine import (
    BlockUntilAbort,
    FakeEngine,
    HoldUntil,
    StreamUntil,
)
from tests.service.coordinator.agent_stack import (
    TOOLS,
    Stack,
    answer_the_tool_call,
    assistant_dict,
    call_text,
    instance_there,
    read_streamed_text,
)
from tests.unit.rollout.rig import JOB, THERE, make_task
from tests.waiting import wait_until


async def test_an_episode_never_closed_times_out_and_is_dropped_and_counted(
        stack: Stack) -> None:
    stack.rig.engine.queue("thinking<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    await stack.client(episode).chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}])
    # The program never calls again: past task.episode_idle_timeout_s (30 s) it fails.
    stack.episode_clock.advance(31.0)
    (traj,) = await stack.rig.run_until_published(1)
    assert traj.status is t.TrajectoryStatus.FAILED
    assert traj.failure_reason.startswith("episode timed out")
    assert await stack.counter("episodes_timed_out") == 1


@pytest.mark.parametrize("row", ["stopped mid-turn", "finished before the abort"])
async def test_a_client_gone_mid_call_aborts_it_and_its_turn_never_reaches_training(
        stack: Stack, row: str) -> None:
    """The client goes away while its turn is sampled: the rollout sees the abort and
    stops the episode's engine row at the next token (the fake engine returns only
    then), or, when the turn ended first, takes the finished turn back."""
    release = threading.Event()
    held = (BlockUntilAbort("LEAKED<|im_end|>", keep=2) if row == "stopped mid-turn"
            else HoldUntil("LEAKED<|im_end|>", release))
    stack.rig.engine.queue(call_text("5*5"), held, "It is 25.<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "5*5?"}]
    first = await client.chat.completions.create(model=stack.model, messages=messages, tools=TOOLS)
    tool_call = first.choices[0].message.tool_calls[0]
    messages += [assistant_dict(first.choices[0].message),
                 {"role": "tool", "tool_call_id": tool_call.id, "content": "25"}]
    gone = asyncio.create_task(client.chat.completions.create(
        model=stack.model, messages=messages, tools=TOOLS, stream=True))
    await wait_until(lambda: len(stack.rig.engine.requests) == 2)  # it is generating
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    await wait_until(lambda: stack.counter("episode_calls_aborted"), timeout_s=10.0)
    if row == "stopped mid-turn":
        # The row was stopped by the rollout (the fake would otherwise hold it 5 s).
        await wait_until(lambda: stack.rig.engine.aborted_rows == [0])
    release.set()
    # (409 while the gone call's handler still finishes: the client retries it.)
    again = await client.with_options(max_retries=3).chat.completions.create(
        model=stack.model, messages=messages, tools=TOOLS)
    assert again.choices[0].message.content == "It is 25."
    await stack.http.post(f"{stack.base_url}/v1/episodes/{episode['episode_id']}/reward",
                          json={"reward": 1.0},
                          headers={"Authorization": f"Bearer {episode['api_key']}"})
    (traj,) = await stack.rig.run_until_published(1)
    # As if the aborted call never happened: its turn and its messages (sent again by
    # the retry) are each in the trajectory once, or not at all.
    chat, tok = stack.chat(), stack.tokenizer
    prompt = chat.prompt_ids(messages[:1])
    tool_turn = chat.tool_turn_ids([{"role": "tool", "name": "calculator", "content": "25"}],
                                   turn_closed=True)
    assert traj.token_ids == (prompt + tok.encode(call_text("5*5")) + tool_turn
                              + tok.encode("It is 25.<|im_end|>"))
    assert traj.check_aligned() is None and traj.num_turns == 2
    assert [s.tool_type for s in traj.tool_states] == ["calculator"]


async def test_a_client_gone_mid_stream_aborts_the_call_and_nothing_leaks(
        stack: Stack) -> None:
    """The program reads the first piece of a streamed turn and hangs up: the call is
    aborted, the turn's pieces already sent are never trained nor shown again."""
    release = threading.Event()
    stack.rig.engine.queue(StreamUntil("Thinking it over ", release, "LEAKED<|im_end|>"),
                           "It is 4.<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    messages = [{"role": "user", "content": "2+2?"}]
    stream = await client.chat.completions.create(model=stack.model, messages=messages,
                                                  tools=TOOLS, stream=True)
    chunks = aiter(stream)
    await anext(chunks)  # the role
    await read_streamed_text(chunks, "Thinking it over")  # sampled before the engine blocks
    await stream.close()
    await wait_until(lambda: stack.counter("episode_calls_aborted"), timeout_s=10.0)
    release.set()
    again = await client.with_options(max_retries=3).chat.completions.create(
        model=stack.model, messages=messages, tools=TOOLS)
    assert again.choices[0].message.content == "It is 4."
    await stack.close(episode, {"reward": 1.0})
    (traj,) = await stack.rig.run_until_published(1)
    prompt = stack.chat().prompt_ids(messages)
    assert traj.token_ids == prompt + stack.tokenizer.encode("It is 4.<|im_end|>")
    assert traj.segments == [] and traj.num_turns == 1


async def test_a_second_call_while_one_is_in_flight_is_a_conflict(stack: Stack) -> None:
    release = threading.Event()
    stack.rig.engine.queue(HoldUntil("first<|im_end|>", release))
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    user = [{"role": "user", "content": "hi"}]
    first = asyncio.create_task(client.chat.completions.create(model=stack.model,
                                                               messages=user))
    await wait_until(lambda: len(stack.rig.engine.requests) == 1)  # generating
    with pytest.raises(openai.ConflictError, match="in flight"):
        await client.chat.completions.create(model=stack.model, messages=user)
    release.set()
    assert (await first).choices[0].message.content == "first"


async def test_an_episode_moved_between_buckets_goes_on_on_the_target_instance(
        stack: Stack, tmp_path: Path) -> None:
    """The scheduler moves the episode at its first "tool return" (the program's first
    call): the target instance samples the reply and takes the next call. Whether the
    move lands before this instance's engine call or during it (its row is then stopped
    at once, with no token), the turn is sampled there."""
    there_engine = FakeEngine(stack.tokenizer)
    there_engine.queue(call_text("6*7"), "It is 42.<|im_end|>")
    async with instance_there(stack, there_engine):
        stack.rig.scheduler.move_to(THERE)
        stack.rig.engine.queue(BlockUntilAbort("", keep=0))
        await stack.rig.place(make_task(0))
        stack.rig.start()
        episode = await stack.open()
        client = stack.client(episode)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "6*7?"}]
        first = await client.chat.completions.create(model=stack.model, messages=messages,
                                                     tools=TOOLS)
        second = await answer_the_tool_call(stack, client, messages, first)
        assert second.choices[0].message.content == "It is 42."
        await stack.http.post(
            f"{stack.base_url}/v1/episodes/{episode['episode_id']}/reward",
            json={"reward": 1.0}, headers={"Authorization": f"Bearer {episode['api_key']}"})
        (traj,) = await stack.rig.run_until_published(1)
        assert traj.instance_id == THERE and traj.num_migrations == 1
        assert traj.reward == 1.0 and traj.check_aligned() is None
        assert stack.rig.engine.requests == [] or stack.rig.engine.aborted_rows == [0]
        assert len(there_engine.requests) == 2  # both turns were sampled THERE


AGENT_PROGRAM = '''
import os, sys, time
import httpx
prompt = sys.stdin.read()
assert prompt == os.environ["LIBRA_PROMPT"]
if prompt == "hang":
    time.sleep(600)
if prompt == "fail":
    sys.exit(3)
reply = httpx.post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", timeout=60.0,
                   headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
                   json={"model": os.environ["LIBRA_MODEL"],
                         "messages": [{"role": "user", "content": prompt}]})
reply.raise_for_status()
'''


async def test_the_driver_runs_one_copy_per_episode_and_collects_exits_and_timeouts(
        stack: Stack, tmp_path: Path) -> None:
    """`libra agent run`'s driver over the endpoint: a copy per episode with its key and
    prompt; one answers and exits 0 (the driver closes its episode: scored by the job's
    reward), one fails (exit 3), one hangs past --timeout-s (killed by pid)."""
    program = tmp_path / "agent.py"
    program.write_text(AGENT_PROGRAM)
    stack.rig.engine.queue("84<|im_end|>")
    stack.rig.tools.reward = 0.25
    for index, prompt in enumerate(("ok", "fail", "hang")):
        await stack.rig.place(make_task(index, prompt=prompt))
    stack.rig.start()
    with httpx.Client(timeout=60.0) as http:
        driver = Driver(http, stack.base_url, JOB, [sys.executable, str(program)],
                        max_running=3, timeout_s=10.0, max_episodes=3)
        summary = await asyncio.to_thread(driver.run)
    assert (summary.episodes, dict(summary.exit_codes), summary.timed_out,
            summary.closed_by_driver) == (3, {0: 1, 3: 1}, 1, 1)
    (traj,) = await stack.rig.run_until_published(1)
    assert traj.prompt_text == "ok" and traj.reward == 0.25


async def test_a_call_past_max_turns_is_refused_naming_the_limit(stack: Stack) -> None:
    stack.rig.engine.queue(*[f"turn {i}<|im_end|>" for i in range(4)])  # max_turns = 4
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go on"}]
    for _ in range(4):
        reply = await client.chat.completions.create(model=stack.model, messages=messages)
        messages += [assistant_dict(reply.choices[0].message),
                     {"role": "user", "content": "go on"}]
    with pytest.raises(openai.BadRequestError, match="task.max_turns = 4"):
        await client.chat.completions.create(model=stack.model, messages=messages)
