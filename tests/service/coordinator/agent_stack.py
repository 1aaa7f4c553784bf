"""The agent endpoint's test stack (the ``stack`` fixture), shared by
test_agent_endpoint.py (calls and what they record) and test_agent_episode_life.py
(timeouts, aborts, conflicts, moves, the driver).

``instance_there`` adds a second rollout instance on the same Redis.

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
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
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
from tests.fakes.engine import FakeEngine, FakeEngineLoader
from tests.fakes.runner import FakeRunner
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway
from tests.unit.rollout.rig import JOB, THERE, Rig, started_rig
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
                      episode_idle_timeout_s=idle_timeout_s,
                      # The rollout's clock stands still here, so a batching window
                      # could close only once every awaited call came: tests that hold
                      # one episode's call until another's reply would wait forever.
                      # The window has its own tests (tests/unit/rollout).
                      episode_batch_window_ms=0.0),
        tools=ToolsSpec(schemas=[ToolSchema(name="calculator", description="Evaluate.",
                                            parameters_json=json.dumps(CALC_SCHEMA))]))


@dataclass
class Stack:
    rig: Rig
    base_url: str
    http: httpx.AsyncClient
    tokenizer: HfTokenizer
    model: str
    episode_clock: FakeClock
    """The rollout's episode idle timer (advance it to time an episode out)."""
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)
    """Every client the test made, closed at teardown (on the test's loop)."""

    async def open(self) -> dict[str, Any]:
        response = await self.http.post(f"{self.base_url}/v1/episodes",
                                        json={"job_id": JOB, "wait_s": 10})
        assert response.status_code == 201, response.text
        return response.json()

    def client(self, episode: dict[str, Any]) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=episode["base_url"], api_key=episode["api_key"],
                                    max_retries=0)
        self.clients.append(client)
        return client

    async def close(self, episode: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
        """``POST /v1/episodes/{id}/reward`` with the episode's key."""
        return await self.http.post(
            f"{self.base_url}/v1/episodes/{episode['episode_id']}/reward", json=body,
            headers={"Authorization": f"Bearer {episode['api_key']}"})

    async def counter(self, name: str) -> int:
        return (await self.rig.counters()).get(name, 0)

    def chat(self) -> ChatFormat:
        return ChatFormat(self.tokenizer.tokenizer, tools=TOOLS, parser=get_parser("hermes"))


@pytest.fixture
async def stack(redis_server, tmp_path: Path, hf_model_dir) -> AsyncIterator[Stack]:
    model_dir = hf_model_dir("qwen2")
    hf = load_tokenizer(str(model_dir))
    tokenizer = HfTokenizer(hf, [hf.eos_token_id], MAX_CONTEXT_TOKENS)
    # The rollout's idle timer runs on a clock the test advances (an episode times out
    # when the test says so, never because the machine was slow), starting at the real
    # time so offers stay live for the endpoint's real clock.
    episode_clock = FakeClock(start_s=time.time())
    r = aioredis.from_url(redis_server.url, decode_responses=False)
    spec = external_spec(model_dir)
    async with started_rig(tmp_path, redis=r, spec=spec, tokenizer=tokenizer,
                           episodes=RedisEpisodeChannel(r, episode_clock)) as rig:
        coord_redis = aioredis.from_url(redis_server.url, decode_responses=True)
        coord_store = RedisCoordinatorStore(coord_redis, SystemClock())
        # The job as the coordinator keeps it (GET /v1/jobs/{id}, which the driver reads).
        await coord_store.put_job(t.Job(t.JobId(JOB), "ext", t.JobState.RUNNING,
                                        spec.to_json(), 0, 0, run_dir=str(tmp_path)))
        core = CoordinatorCore(coord_store, FakeRunner(), FakeRunner(), SystemClock(),
                               tmp_path / "runs")
        endpoint = EpisodeEndpoint(RedisEpisodeStore(coord_redis, SystemClock()), SystemClock())
        port = free_port()
        # A bounded graceful shutdown: a call still waiting for a reply is cancelled.
        server = uvicorn.Server(uvicorn.Config(build_app(core, None, endpoint),
                                               host="127.0.0.1", port=port, log_level="warning",
                                               timeout_graceful_shutdown=5))
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        serving = asyncio.create_task(server.serve())
        await wait_until(lambda: server.started)
        async with httpx.AsyncClient(timeout=30.0) as http:
            stack = Stack(rig, f"http://127.0.0.1:{port}", http, tokenizer, model_dir.name,
                          episode_clock)
            yield stack
            for client in stack.clients:
                await client.close()
        await rig.stop()
        rig.task = None  # stopped (the rig's own exit would stop it again)
        # Episodes still waiting for a call are the core's tasks: end them with the
        # test (a process exit does it in production), or they read the next test's calls.
        pending = list(rig.core._tasks)
        for task in pending:
            task.cancel()
        if pending:
            _, running = await asyncio.wait(pending, timeout=60.0)
            assert not running, f"{len(running)} episode task(s) kept running after cancel()"
        server.should_exit = True
        await serving
        await coord_redis.aclose()
    await r.aclose()


@asynccontextmanager
async def instance_there(stack: Stack, engine: FakeEngine) -> AsyncIterator[RolloutCore]:
    """A second rollout instance (THERE, bucket "long") on the stack's Redis, running
    ``engine``; stopped, with its episode tasks, on exit."""
    r = stack.rig.world.r  # the rig's Redis client (bytes)
    there = RolloutCore(
        RolloutSettings(instance_id=THERE, bucket="long", lease_ttl_ms=60_000,
                        tool_deadline_s=5.0, idle_block_ms=5),
        RedisRolloutStore(r), FakeEngineLoader(engine), FakeToolGateway(),
        FakeScheduler(), FakeCoordinator(redis=r), FakeClock(),
        episodes=RedisEpisodeChannel(r, SystemClock()))
    await there.register()
    there_loop = asyncio.create_task(there.run())
    try:
        yield there
    finally:
        await there.drain(0.0)
        pending = [there_loop, *there._tasks]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def answer_the_tool_call(stack: Stack, client: Any, messages: list[dict[str, Any]],
                               first: Any) -> Any:
    """The calculator episode's second call: ``first``'s tool call answered with 42
    (``messages`` gains the assistant turn and the tool message)."""
    call = first.choices[0].message.tool_calls[0]
    messages += [assistant_dict(first.choices[0].message),
                 {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    return await client.chat.completions.create(model=stack.model, messages=messages,
                                                tools=TOOLS)


def assistant_dict(message: Any) -> dict[str, Any]:
    """The reply as an agent appends it (the openai message model, as a dict)."""
    return message.model_dump(exclude_none=True)


async def read_streamed_text(chunks: AsyncIterator[Any], text: str,
                             timeout_s: float = 20.0) -> None:
    """Read streamed pieces until they add up to ``text``. The pieces follow the
    engine's steps, so how the text is split depends on timing; each must continue it."""
    shown = ""
    while shown != text:
        delta = (await asyncio.wait_for(anext(chunks), timeout=timeout_s)).choices[0].delta
        shown += delta.content or ""
        assert text.startswith(shown), (shown, text)
