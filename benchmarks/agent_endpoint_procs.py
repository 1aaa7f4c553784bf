"""The processes bench_agent_endpoint.py starts: an agent program (``--worker URL
EPISODES CLIENT``: takes episodes and drives each through the endpoint with the openai
client or a raw keep-alive connection, then prints its call latencies and CPU) and the
endpoint server (``--serve PORT REDIS [PROFILE]``: the coordinator's agent router under
uvicorn, optionally under cProfile)."""

from __future__ import annotations

import cProfile
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra.clock import SystemClock  # noqa: E402

JOB = "job-bench"
CALC = {"type": "object", "properties": {"expression": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate.",
                                           "parameters": CALC}}]


def worker(url: str, episodes: int, client_kind: str) -> None:
    """One agent process: take episodes, run every call through the openai client, or
    (``raw``) one keep-alive stdlib HTTP connection and json, the least an agent can
    spend per call, so that what remains is the endpoint's cost and the rollout's."""
    import httpx

    if client_kind == "openai":
        import openai  # noqa: F401  (imported before "ready": seconds on a busy machine)

    latencies: list[float] = []
    call_cpu_s = 0.0  # CPU inside the chat-completion calls only (not setup, not opens)
    # Built before "ready": a client's SSL context costs ~0.1 s of CPU, process start-up
    # that the internal arm does not pay (32 of them: seconds of the arm's two cores).
    http = httpx.Client(timeout=60.0)
    print("ready", flush=True)
    ready_cpu_s = time.process_time()  # from here: the agent's CPU during the arm
    with http:
        for _ in range(episodes):
            response = http.post(f"{url}/v1/episodes", json={"job_id": JOB, "wait_s": 30})
            response.raise_for_status()
            episode = response.json()
            complete = (_openai_caller(episode) if client_kind == "openai"
                        else _raw_caller(url, episode))
            messages: list[dict[str, Any]] = [{"role": "user", "content": "2+3?"}]
            for index in range(1_000):
                started, cpu_started_s = time.perf_counter(), time.process_time()
                message = complete(messages)
                call_cpu_s += time.process_time() - cpu_started_s
                # Like the internal gaps: from a tool result to the next tool call (the
                # first call renders the prompt and has no internal counterpart).
                if index > 0 and message.get("tool_calls"):
                    latencies.append(time.perf_counter() - started)
                messages.append(message)
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "5"})
            http.post(f"{episode['base_url']}/episodes/{episode['episode_id']}/reward",
                      json={"reward": 1.0},
                      headers={"Authorization": f"Bearer {episode['api_key']}"})
    print(json.dumps({"latencies_s": latencies, "cpu_s": call_cpu_s,
                      "cpu_total_s": time.process_time() - ready_cpu_s}))


def _openai_caller(episode: dict[str, Any]) -> Any:
    import openai

    client = openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"])

    def complete(messages: list[dict[str, Any]]) -> dict[str, Any]:
        reply = client.chat.completions.create(model=episode["model"], messages=messages,
                                               tools=TOOLS)
        return reply.choices[0].message.model_dump(exclude_none=True)

    return complete


def _raw_caller(url: str, episode: dict[str, Any]) -> Any:
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
    headers = {"Authorization": f"Bearer {episode['api_key']}",
               "Content-Type": "application/json"}

    def complete(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = json.dumps({"model": episode["model"], "messages": messages, "tools": TOOLS})
        connection.request("POST", "/v1/chat/completions", body, headers)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {data[:200]!r}")
        message: dict[str, Any] = json.loads(data)["choices"][0]["message"]
        return message

    return complete


def serve_endpoint(port: int, redis_url: str, profile_path: str = "") -> None:
    """The endpoint as the coordinator serves it (only its router, no job API); with
    ``profile_path``, under cProfile (CPU time: load-independent) until it is stopped
    (SIGTERM: uvicorn returns)."""
    import redis.asyncio as aioredis
    import uvicorn
    from fastapi import FastAPI

    from services.coordinator.agent_rest import agent_router
    from services.coordinator.episode_endpoint import EpisodeEndpoint
    from services.coordinator.episode_store import RedisEpisodeStore

    redis = aioredis.from_url(redis_url, decode_responses=True)
    app = FastAPI()
    app.include_router(agent_router(EpisodeEndpoint(RedisEpisodeStore(redis, SystemClock()),
                                                    SystemClock()), []))
    profiler = cProfile.Profile(time.process_time) if profile_path else None
    if profiler is not None:
        # uvicorn re-raises the SIGTERM it caught once it has shut down, with the handler
        # it found: make that an exit that runs the finally below.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        profiler.enable()
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(profile_path)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"] and len(argv) == 4:
        worker(argv[1], int(argv[2]), argv[3])
    elif argv[:1] == ["--serve"] and 3 <= len(argv) <= 4:
        serve_endpoint(int(argv[1]), argv[2], *argv[3:])
    else:
        print("usage: agent_endpoint_procs.py --worker URL EPISODES CLIENT | "
              "--serve PORT REDIS [PROFILE]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
