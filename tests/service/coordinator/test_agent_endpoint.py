"""The OpenAI-compatible agent endpoint with the official ``openai`` client.

Real: the coordinator's REST app (build_app with the episode endpoint) served by uvicorn
on a loopback socket, the ``openai`` AsyncOpenAI client, Redis (the session's
redis-server) between endpoint and rollout, the rollout core running the ``external``
agent over the tiny Qwen2 fixture's real chat template and tokenizer. Fakes (the rig,
tests/unit/rollout/rig.py): the engine (scripted turns), the tool gateway (scores), the
scheduler (stays) and the coordinator's lease side; the job API's runners.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis.asyncio as aioredis
import uvicorn

from libra import types as t
from libra.chat.protocol import ChatFormat
from libra.chat.toolcalls import get_parser
from libra.clock import FakeClock, SystemClock
from libra.jobspec import JobSpec, ModelSpec, TaskSpec, ToolSchema, ToolsSpec
from libra.models.hf import load_tokenizer
from libra_cli.agent import Driver
from libra_cli.redis_server import free_port
from services.coordinator.core import CoordinatorCore
from services.coordinator.episode_endpoint import EpisodeEndpoint
from services.coordinator.episode_store import RedisEpisodeStore
from services.coordinator.rest import build_app
from services.coordinator.store import RedisCoordinatorStore
from services.rollout.backend import HfTokenizer
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.episode_channel import RedisEpisodeChannel
from services.rollout.store import RedisRolloutStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.engine import BlockUntilAbort, FakeEngine, FakeEngineLoader, HoldUntil
from tests.fakes.runner import FakeRunner
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway
from tests.unit.rollout.rig import JOB, THERE, Rig, make_task, started_rig
from tests.waiting import wait_until

MAX_CONTEXT_TOKENS = 400
CALC_SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}},
               "required": ["expression"]}
TOOLS = [{"type": "function", "function": {"name": "calculator",
                                           "description": "Evaluate arithmetic.",
                                           "parameters": CALC_SCHEMA}}]


def call_text(expression: str) -> str:
    return ("<tool_call>\n" + json.dumps({"name": "calculator",
                                          "arguments": {"expression": expression}})
            + "\n</tool_call><|im_end|>")


def external_spec(model_dir: Path, idle_timeout_s: float = 30.0) -> JobSpec:
    return JobSpec(
        model=ModelSpec(kind="hf", path=str(model_dir)),
        task=TaskSpec(name="calc-words", max_turns=4, max_new_tokens_per_turn=64,
                      tool_call_format="hermes", agent="external",
                      episode_idle_timeout_s=idle_timeout_s),
        tools=ToolsSpec(schemas=[ToolSchema(name="calculator", description="Evaluate.",
                                            parameters_json=json.dumps(CALC_SCHEMA))]))


@dataclass
class Stack:
    rig: Rig
    base_url: str
    http: httpx.AsyncClient
    tokenizer: HfTokenizer
    model: str

    async def open(self) -> dict[str, Any]:
        response = await self.http.post(f"{self.base_url}/v1/episodes",
                                        json={"job_id": JOB, "wait_s": 10})
        assert response.status_code == 201, response.text
        return response.json()

    def client(self, episode: dict[str, Any]) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=episode["base_url"], api_key=episode["api_key"],
                                  max_retries=0)

    async def counter(self, name: str) -> int:
        return (await self.rig.counters()).get(name, 0)

    def chat(self) -> ChatFormat:
        return ChatFormat(self.tokenizer.tokenizer, tools=TOOLS, parser=get_parser("hermes"))


@pytest.fixture
async def stack(redis_server, tmp_path: Path, hf_model_dir, request) -> AsyncIterator[Stack]:
    model_dir = hf_model_dir("qwen2")
    hf = load_tokenizer(str(model_dir))
    tokenizer = HfTokenizer(hf, [hf.eos_token_id], MAX_CONTEXT_TOKENS)
    idle_timeout_s = getattr(request, "param", 30.0)
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    spec = external_spec(model_dir, idle_timeout_s)
    async with started_rig(tmp_path, redis=r, spec=spec, tokenizer=tokenizer,
                           episodes=RedisEpisodeChannel(r, SystemClock())) as rig:
        coord_redis = aioredis.from_url(redis_server.url, decode_responses=True)
        coord_store = RedisCoordinatorStore(coord_redis, SystemClock())
        # The job as the coordinator keeps it (GET /v1/jobs/{id}, which the driver reads).
        await coord_store.put_job(t.Job(t.JobId(JOB), "ext", t.JobState.RUNNING,
                                        spec.to_json(), 0, 0, run_dir=str(tmp_path)))
        core = CoordinatorCore(coord_store, FakeRunner(), FakeRunner(), SystemClock(),
                               tmp_path / "runs")
        endpoint = EpisodeEndpoint(RedisEpisodeStore(coord_redis, SystemClock()), SystemClock())
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(build_app(core, None, endpoint),
                                               host="127.0.0.1", port=port, log_level="warning"))
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        serving = asyncio.create_task(server.serve())
        await wait_until(lambda: server.started)
        async with httpx.AsyncClient(timeout=30.0) as http:
            yield Stack(rig, f"http://127.0.0.1:{port}", http, tokenizer, model_dir.name)
        await rig.stop()
        rig.task = None  # stopped (the rig's own exit would stop it again)
        # Episodes still waiting for a call are the core's tasks: end them with the
        # test (a process exit does it in production), or they read the next test's calls.
        pending = list(rig.core._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        server.should_exit = True
        await serving
        await coord_redis.aclose()
    await r.aclose()


def assistant_dict(message: Any) -> dict[str, Any]:
    """The reply as an agent appends it (the openai message model, as a dict)."""
    return message.model_dump(exclude_none=True)


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


async def test_streaming_returns_the_turn_as_chunks(stack: Stack) -> None:
    stack.rig.engine.queue(call_text("2+3"))
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    stream = await stack.client(episode).chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "2+3?"}], tools=TOOLS, stream=True)
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant"
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("calculator", {"expression": "2+3"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_a_rewritten_history_starts_a_new_sequence_and_is_counted(stack: Stack) -> None:
    stack.rig.engine.queue(call_text("1+1"), "It is 2.<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    client = stack.client(episode)
    await client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "1+1?"}], tools=TOOLS)
    # The agent summarised its history instead of appending the reply.
    rewritten = [{"role": "user", "content": "1+1? (the calculator said 2)"}]
    answer = await client.chat.completions.create(model=stack.model, messages=rewritten,
                                                  tools=TOOLS)
    assert answer.choices[0].message.content == "It is 2."
    await stack.http.post(f"{stack.base_url}/v1/episodes/{episode['episode_id']}/reward",
                          json={"reward": 0.5},
                          headers={"Authorization": f"Bearer {episode['api_key']}"})
    (traj,) = await stack.rig.run_until_published(1)
    assert await stack.counter("episode_splits") == 1
    prompt = stack.chat().prompt_ids(rewritten)
    assert traj.token_ids == prompt + stack.tokenizer.encode("It is 2.<|im_end|>")
    assert traj.num_prompt_tokens == len(prompt) and traj.reward == 0.5


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


@pytest.mark.parametrize("stack", [0.5], indirect=True)
async def test_an_episode_never_closed_times_out_and_is_dropped_and_counted(
        stack: Stack) -> None:
    stack.rig.engine.queue("thinking<|im_end|>")
    await stack.rig.place(make_task(0))
    stack.rig.start()
    episode = await stack.open()
    await stack.client(episode).chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}])
    (traj,) = await stack.rig.run_until_published(1)  # the program never calls again
    assert traj.status is t.TrajectoryStatus.FAILED
    assert traj.failure_reason.startswith("episode timed out")
    assert await stack.counter("episodes_timed_out") == 1


async def test_a_client_gone_mid_call_aborts_it_and_its_turn_never_reaches_training(
        stack: Stack) -> None:
    release = threading.Event()
    stack.rig.engine.queue(call_text("5*5"), HoldUntil("LEAKED<|im_end|>", release),
                           "It is 25.<|im_end|>")
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
    r = stack.rig.world.r  # the rig's Redis client (bytes)
    there_engine = FakeEngine(stack.tokenizer)
    there_engine.queue(call_text("6*7"), "It is 42.<|im_end|>")
    there = RolloutCore(
        RolloutSettings(instance_id=THERE, bucket="long", lease_ttl_ms=60_000,
                        tool_deadline_s=5.0, idle_block_ms=5),
        RedisRolloutStore(r), FakeEngineLoader(there_engine), FakeToolGateway(),
        FakeScheduler(), FakeCoordinator(redis=r), FakeClock(),
        episodes=RedisEpisodeChannel(r, SystemClock()))
    await there.register()
    there_loop = asyncio.create_task(there.run())
    try:
        stack.rig.scheduler.move_to(THERE)
        stack.rig.engine.queue(BlockUntilAbort("", keep=0))
        await stack.rig.place(make_task(0))
        stack.rig.start()
        episode = await stack.open()
        client = stack.client(episode)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "6*7?"}]
        first = await client.chat.completions.create(model=stack.model, messages=messages,
                                                     tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [assistant_dict(first.choices[0].message),
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        second = await client.chat.completions.create(model=stack.model, messages=messages,
                                                      tools=TOOLS)
        assert second.choices[0].message.content == "It is 42."
        await stack.http.post(
            f"{stack.base_url}/v1/episodes/{episode['episode_id']}/reward",
            json={"reward": 1.0}, headers={"Authorization": f"Bearer {episode['api_key']}"})
        (traj,) = await stack.rig.run_until_published(1)
        assert traj.instance_id == THERE and traj.num_migrations == 1
        assert traj.reward == 1.0 and traj.check_aligned() is None
        assert stack.rig.engine.requests == [] or stack.rig.engine.aborted_rows == [0]
        assert len(there_engine.requests) == 2  # both turns were sampled THERE
    finally:
        await there.drain(0.0)
        there_loop.cancel()
        pending = [there_loop, *there._tasks]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


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
