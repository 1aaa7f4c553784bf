"""The OpenAI-compatible agent endpoint with the official ``openai`` client: calls,
what they record (token-exact turns, split sequences), streaming, request fields and
errors. The stack (real REST app, Redis, rollout core, tokenizer; scripted engine):
agent_stack.py.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import openai
import pytest

from libra import types as t
from services.trainer.grpo import to_samples
from tests.fakes.engine import StreamUntil
from tests.service.coordinator.agent_stack import (
    MAX_CONTEXT_TOKENS,
    TOOLS,
    Stack,
    assistant_dict,
    call_text,
    read_streamed_text,
)
from tests.unit.rollout.rig import make_task


async def test_a_multi_turn_tool_calling_episode_is_recorded_token_exact(stack: Stack) -> None:
    stack.rig.engine.queue(call_text("12*7"), "The answer is 84.<|im_end|>")
    await stack.rig.place(make_task(0, prompt="What is 12*7?", reference="84"))
    stack.rig.start()
    episode = await stack.open()
    assert episode["prompt"] == "What is 12*7?" and episode["model"] == stack.model
    client = stack.client(episode)
    assert [m.id for m in (await client.models.list()).data] == [stack.model]

    messages: list[dict[str, Any]] = [{"role": "user", "content": episode["prompt"]}]
    first = await client.chat.completions.create(model=stack.model, messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (tool_call,) = choice.message.tool_calls
    assert tool_call.function.name == "calculator"
    assert json.loads(tool_call.function.arguments) == {"expression": "12*7"}
    messages += [assistant_dict(choice.message),
                 {"role": "tool", "tool_call_id": tool_call.id, "content": "84"}]
    second = await client.chat.completions.create(model=stack.model, messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "The answer is 84."
    assert second.choices[0].finish_reason == "stop"

    closed = await stack.http.post(f"{stack.base_url}/v1/episodes/{episode['episode_id']}/reward",
                                   json={"reward": 1.0},
                                   headers={"Authorization": f"Bearer {episode['api_key']}"})
    assert closed.status_code == 200, closed.text
    (traj,) = await stack.rig.run_until_published(1)
    assert traj.status is t.TrajectoryStatus.FINISHED and traj.reward == 1.0
    chat, tok = stack.chat(), stack.tokenizer
    prompt = chat.prompt_ids(messages[:1])
    turn1, turn2 = tok.encode(call_text("12*7")), tok.encode("The answer is 84.<|im_end|>")
    tool_turn = chat.tool_turn_ids([{"role": "tool", "name": "calculator", "content": "84"}],
                                   turn_closed=True)
    assert traj.token_ids == prompt + turn1 + tool_turn + turn2
    assert traj.loss_mask == ([0] * len(prompt) + [1] * len(turn1) + [0] * len(tool_turn)
                              + [1] * len(turn2))
    assert traj.logprobs[len(prompt)] == -0.5 and traj.token_versions[len(prompt)] == 0
    assert traj.check_aligned() is None
    assert [s.tool_type for s in traj.tool_states] == ["calculator"]
    assert second.usage.completion_tokens == len(turn2)
    # The key expired with its episode.
    with pytest.raises(openai.AuthenticationError):
        await client.models.list()


async def test_streaming_sends_the_turn_as_it_is_sampled(stack: Stack) -> None:
    """The text goes out while the engine is still sampling the turn (the fake engine
    holds the turn mid-way); the tool call follows with the final reply, and what the
    program assembled from the pieces extends the conversation (no split)."""
    release = threading.Event()
    stack.rig.engine.queue(StreamUntil("Let me compute. ", release, call_text("2+3")),
                           "It is 5.<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+3?"}]
    stream = await client.chat.completions.create(
        model=stack.model, messages=messages, tools=TOOLS, stream=True)
    chunks = aiter(stream)
    assert (await anext(chunks)).choices[0].delta.role == "assistant"
    # The engine holds the turn until released: what arrives before was sent mid-turn.
    await read_streamed_text(chunks, "Let me compute.")
    assert not release.is_set()
    release.set()
    rest = [chunk async for chunk in chunks]
    content = "Let me compute." + "".join(c.choices[0].delta.content or "" for c in rest)
    calls = [tc for c in rest for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("calculator", {"expression": "2+3"})]
    assert rest[-1].choices[0].finish_reason == "tool_calls"
    messages += [{"role": "assistant", "content": content, "tool_calls": [
        {"id": calls[0].id, "type": "function", "function": {
            "name": "calculator", "arguments": calls[0].function.arguments}}]},
                 {"role": "tool", "tool_call_id": calls[0].id, "content": "5"}]
    answer = await client.chat.completions.create(model=stack.model, messages=messages,
                                                  tools=TOOLS)
    assert answer.choices[0].message.content == "It is 5."
    assert await stack.counter("episode_splits") == 0


async def test_a_rewritten_history_trains_every_segment_and_is_counted(stack: Stack) -> None:
    """AReaL's split: the sequence before the rewrite is kept as a segment and trained
    as its own sequence (same group, same reward); the episode is one trajectory."""
    stack.rig.engine.queue(call_text("1+1"), "It is 2.<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    asked = [{"role": "user", "content": "1+1?"}]
    await client.chat.completions.create(model=stack.model, messages=asked, tools=TOOLS)
    # The agent summarised its history instead of appending the reply.
    rewritten = [{"role": "user", "content": "1+1? (the calculator said 2)"}]
    answer = await client.chat.completions.create(model=stack.model, messages=rewritten,
                                                  tools=TOOLS)
    assert answer.choices[0].message.content == "It is 2."
    await stack.close(episode, {"reward": 0.5})
    (traj,) = await stack.rig.run_until_published(1)
    assert await stack.counter("episode_splits") == 1
    chat, tok = stack.chat(), stack.tokenizer
    prompt = chat.prompt_ids(rewritten)
    assert traj.token_ids == prompt + tok.encode("It is 2.<|im_end|>")
    assert traj.num_prompt_tokens == len(prompt) and traj.reward == 0.5
    (segment,) = traj.segments
    first_prompt, first_turn = chat.prompt_ids(asked), tok.encode(call_text("1+1"))
    assert segment.token_ids == first_prompt + first_turn
    assert segment.loss_mask == [0] * len(first_prompt) + [1] * len(first_turn)
    assert segment.logprobs[len(first_prompt)] == -0.5 and traj.check_aligned() is None
    # Both sequences train, with the episode's advantage (a singleton group: its reward).
    samples = to_samples([traj])
    assert [s.token_ids for s in samples] == [segment.token_ids, traj.token_ids]
    assert [s.advantage for s in samples] == [0.5, 0.5]


async def test_a_close_without_reward_is_scored_by_the_jobs_reward(stack: Stack) -> None:
    stack.rig.engine.queue("84<|im_end|>")
    stack.rig.tools.reward = 0.75
    await stack.rig.place(make_task(0, reference="84"))
    stack.rig.start()
    episode = await stack.open()
    await stack.client(episode).chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "12*7?"}])
    await stack.http.post(f"{stack.base_url}/v1/episodes/{episode['episode_id']}/reward",
                          json={}, headers={"Authorization": f"Bearer {episode['api_key']}"})
    (traj,) = await stack.rig.run_until_published(1)
    assert traj.reward == 0.75
    assert stack.rig.tools.scores[0]["final_text"] == "84"


async def test_bad_inputs_are_refused_naming_what_is_wrong(stack: Stack) -> None:
    stack.rig.engine.queue("fine<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        await stack.client({**episode, "api_key": "ep-unknown"}).models.list()
    with pytest.raises(openai.NotFoundError, match="gpt-4o"):
        await client.chat.completions.create(model="gpt-4o", messages=user)
    with pytest.raises(openai.BadRequestError) as bad_tools:
        await client.chat.completions.create(
            model=stack.model, messages=user, tools=[{"type": "function", "function": {}}])
    assert bad_tools.value.body["param"] == "tools[0].function.name"
    with pytest.raises(openai.BadRequestError) as too_long:
        await client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "12 + 7 " * 400}])
    assert too_long.value.code == "context_length_exceeded"
    assert f"max_context_tokens = {MAX_CONTEXT_TOKENS}" in too_long.value.message
    # Nothing was lost: the episode goes on after the refused calls.
    ok = await client.chat.completions.create(model=stack.model, messages=user)
    assert ok.choices[0].message.content == "fine"
    headers = {"Authorization": f"Bearer {episode['api_key']}"}
    other = await stack.http.post(f"{stack.base_url}/v1/episodes/ep-other/reward",
                                  json={"reward": 1}, headers=headers)
    assert other.status_code == 404
    missing_job = await stack.http.post(f"{stack.base_url}/v1/episodes",
                                        json={"job_id": "no-such-job", "wait_s": 1})
    assert missing_job.status_code == 404


async def test_per_call_limits_stops_and_seeds_reach_the_engine_and_other_sampling_is_refused(
        stack: Stack) -> None:
    stack.rig.engine.queue("one two three four<|im_end|>", "It is 4. END")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "2+2?"}]
    with pytest.raises(openai.BadRequestError) as hot:
        await client.chat.completions.create(model=stack.model, messages=messages,
                                             temperature=0.2)
    assert hot.value.body["param"] == "temperature"
    assert "algorithm.temperature = 1" in hot.value.message
    short = await client.chat.completions.create(model=stack.model, messages=messages,
                                                 max_completion_tokens=3, temperature=1.0)
    assert short.usage.completion_tokens == 3
    assert stack.rig.engine.requests[-1].max_new_tokens == 3
    messages += [assistant_dict(short.choices[0].message), {"role": "user", "content": "so?"}]
    stopped = await client.chat.completions.create(model=stack.model, messages=messages,
                                                   stop=["END"], seed=7)
    request = stack.rig.engine.requests[-1]
    assert "END" in request.stop_strings and request.seed == 7
    assert request.max_new_tokens == 64  # the call's limit was the previous call's only
    # The program reads the turn up to the stop string (as OpenAI returns it); the
    # sampled tokens through it are what trains.
    assert stopped.choices[0].message.content.rstrip() == "It is 4."
    await stack.close(episode, {"reward": 1.0})
    (traj,) = await stack.rig.run_until_published(1)
    assert traj.token_ids[-len(stack.tokenizer.encode("It is 4. END")):] == \
        stack.tokenizer.encode("It is 4. END")
