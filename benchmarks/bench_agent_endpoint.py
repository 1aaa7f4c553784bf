"""What the OpenAI-compatible agent endpoint costs per call, against the internal agent
loop: same rollout core, same engine and batch, same episodes.

Arm ``internal``: the built-in chat agent; each tool call goes to an in-process gateway
that answers at once. Arm ``external``: the ``external`` agent; each episode is driven by
one of ``--agents`` agent *processes* (the official ``openai`` client) through the
endpoint (the agent router served by uvicorn in its own process, as in the coordinator)
and Redis; the program runs the tool itself, at once. Arm ``external_nowindow``: the
same with ``task.episode_batch_window_ms = 0`` (the loop steps as soon as one call is
ready: services/rollout/batch_window.py). The arms alternate order round by round.

The engine is a timed stand-in (``--engine-ms`` per batched engine call, a fixed script:
``--tool-turns`` calculator calls, then an answer), so both arms spend exactly the same
time generating and the difference is the endpoint's path: HTTP, the endpoint's checks,
Redis lists, the rollout's render of the new messages. Measured per call (a "cycle": the
time from one tool result being available to the next call arriving): internal = the
gap between a trajectory's consecutive gateway calls; external = the program's
wall time per chat-completion call. Printed: p50/p99 of both, the added p50/p99, and the
throughput (turns/s over the arm's wall time) ratio external/internal.

CPU per turn is measured per process from /proc (rollout, endpoint, the agents together;
``agents_calls``: the agents' CPU inside their chat-completion calls only, ``agents``: all
of it from the arm's start to the last close): load-independent, unlike the wall-clock
figures on a shared machine. ``agents_cpu_share`` is the agents' part of all the CPU the
arm spent (rollout + endpoint + agents): the share of the 2 cores the agent processes
took from the rest.

Usage: python benchmarks/bench_agent_endpoint.py [--agents 32] [--episodes-per-agent 3]
       [--tool-turns 3] [--engine-ms 20] [--rounds 2] [--client openai|raw]
       [--window-ms 50] [--arms internal,external] [--profile DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The agent programs and the endpoint server this benchmark starts as processes.
PROCS = str(Path(__file__).with_name("agent_endpoint_procs.py"))
sys.path.insert(0, str(ROOT))

from agent_endpoint_procs import CALC, JOB  # noqa: E402  (this directory: run as a script)
from procstat import cpu_s  # noqa: E402

from libra import redis_keys as keys  # noqa: E402
from libra import types as t  # noqa: E402
from libra.clock import SystemClock  # noqa: E402
from libra.jobspec import (  # noqa: E402
    JobSpec,
    LayoutSpec,
    ModelSpec,
    TaskSpec,
    ToolSchema,
    ToolsSpec,
)
from libra.types import Bucket  # noqa: E402
from libra_cli.redis_server import free_port, start_redis  # noqa: E402
from services.rollout.engine_types import GenerationRequest, GenerationResult  # noqa: E402

CALL = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n'
        '</tool_call><|im_end|>')


class TimedEngine:
    """``engine_ms`` per batched call; each row: a calculator call until the prompt holds
    ``tool_turns`` tool responses, then an answer."""

    def __init__(self, tokenizer: Any, engine_ms: float, tool_turns: int) -> None:
        self.tokenizer, self.policy_version = tokenizer, 0
        self._engine_s, self._tool_turns = engine_ms / 1000, tool_turns
        self._call, self._answer = tokenizer.encode(CALL), tokenizer.encode("5<|im_end|>")

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        time.sleep(self._engine_s)
        out = []
        for request in requests:
            done = self.tokenizer.decode(request.prompt_token_ids).count("<tool_response>")
            ids = self._call if done < self._tool_turns else self._answer
            out.append(GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids),
                                        finish_reason="stop",
                                        policy_version=self.policy_version))
        return out

    def load_weights(self, *_: Any) -> None: ...

    def load_weights_bytes(self, *_: Any) -> None: ...

    def abort(self) -> None: ...

    def abort_rows(self, _rows: Any) -> None: ...


ARMS = ("internal", "external", "external_nowindow")


def spec(model_dir: Path, agent: str, batch: int, window_ms: float) -> JobSpec:
    return JobSpec(
        model=ModelSpec(kind="hf", path=str(model_dir)),
        task=TaskSpec(name="calc-words", max_turns=32, max_new_tokens_per_turn=64,
                      tool_call_format="hermes", agent=agent, episode_idle_timeout_s=60.0,
                      episode_batch_window_ms=window_ms),
        tools=ToolsSpec(schemas=[ToolSchema(name="calculator", description="Evaluate.",
                                            parameters_json=json.dumps(CALC))]),
        layout=LayoutSpec(buckets=[Bucket(name="short", max_tokens=4096,
                                              max_batch_size=batch,
                                              max_trajectories_per_instance=256)]))


async def run_arm(arm: str, redis_url: str, model_dir: Path, args: argparse.Namespace,
                  endpoint_url: str, server_pid: int) -> dict[str, Any]:
    """One arm on a flushed Redis: place every trajectory, run until all published."""
    import redis.asyncio as aioredis

    from libra.models.hf import load_tokenizer
    from services.rollout.backend import HfTokenizer
    from services.rollout.core import RolloutCore, RolloutSettings
    from services.rollout.episode_channel import RedisEpisodeChannel
    from services.rollout.store import RedisRolloutStore
    from tests.fakes.coordinator import FakeCoordinator
    from tests.fakes.engine import FakeEngineLoader
    from tests.fakes.scheduler import FakeScheduler
    from tests.fakes.toolgateway import FakeToolGateway
    from tests.unit.rollout.rig import make_task

    r = aioredis.from_url(redis_url, decode_responses=False)
    await r.flushdb()
    hf = load_tokenizer(str(model_dir))
    tokenizer = HfTokenizer(hf, [hf.eos_token_id], 4096)
    engine = TimedEngine(tokenizer, args.engine_ms, args.tool_turns)
    job = spec(model_dir, "chat" if arm == "internal" else "external", args.agents,
               0.0 if arm == "external_nowindow" else args.window_ms)
    await r.hset(keys.job(JOB), mapping={"spec_json": job.to_json(), "state": "running"})
    weights = Path(tempfile.mkdtemp()) / "v0"
    weights.write_bytes(b"v0")
    await r.hset(keys.policy(JOB), mapping={
        "version": 0, "weights_path": str(weights), "model_dir": str(model_dir),
        "sha256": hashlib.sha256(b"v0").hexdigest(), "published_at_ms": 0})
    gaps: list[float] = []
    last: dict[str, float] = {}
    tools = FakeToolGateway()
    original = tools.execute

    async def timed_execute(trajectory_id: str, *rest: Any, **kw: Any) -> t.ToolResult:
        now = time.perf_counter()
        if trajectory_id in last:
            gaps.append(now - last[trajectory_id])
        result = await original(trajectory_id, *rest, **kw)
        last[trajectory_id] = time.perf_counter()
        return result

    tools.execute = timed_execute  # type: ignore[method-assign]
    settings = RolloutSettings(instance_id="ro-1", bucket="short", lease_ttl_ms=60_000,
                               max_batch_size=args.agents, max_trajectories=256,
                               idle_block_ms=5)
    core = RolloutCore(settings, RedisRolloutStore(r), FakeEngineLoader(engine), tools,
                       FakeScheduler(), FakeCoordinator(redis=r), SystemClock(),
                       episodes=RedisEpisodeChannel(r, SystemClock()))
    await core.register()
    total = args.agents * args.episodes_per_agent
    workers = []
    if arm != "internal":  # started (imports done) before the clock starts
        workers = [subprocess.Popen([sys.executable, PROCS, "--worker", endpoint_url,
                                     str(args.episodes_per_agent), args.client],
                                    stdout=subprocess.PIPE, text=True)
                   for _ in range(args.agents)]
        for worker_proc in workers:
            assert worker_proc.stdout is not None
            await asyncio.to_thread(worker_proc.stdout.readline)
    from libra.wire.common import encode_trajectory
    for index in range(total):
        task = make_task(index)
        task.job_id = t.JobId(JOB)
        data = encode_trajectory(task)
        await r.xadd(keys.inbox("ro-1"), {"job_id": JOB, "task": data})
        await r.hset(keys.tasks(JOB), task.trajectory_id, data)
        await r.hset(keys.assignments(JOB), task.trajectory_id, "ro-1")
    started = time.perf_counter()
    cpu0 = {"rollout": time.process_time(), "endpoint": cpu_s(server_pid)}
    profiler = cProfile.Profile(time.process_time) if args.profile and arm == "external" else None
    if profiler is not None:
        profiler.enable()
    loop_task = asyncio.create_task(core.run())
    while await r.xlen(keys.trajectories(JOB)) < total:
        if loop_task.done():
            loop_task.result()  # the loop died: show why
        await asyncio.sleep(0.02)
    wall_s = time.perf_counter() - started
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(Path(args.profile) / "rollout.prof")
    cpu = {"rollout": time.process_time() - cpu0["rollout"],
           "endpoint": cpu_s(server_pid) - cpu0["endpoint"], "agents": 0.0,
           "agents_calls": 0.0}
    if workers:
        for proc in workers:
            out, _ = await asyncio.to_thread(proc.communicate)
            record = json.loads(out.splitlines()[-1])
            gaps.extend(record["latencies_s"])
            cpu["agents_calls"] += record["cpu_s"]
            cpu["agents"] += record["cpu_total_s"]
    sizes = core.profile.batch_sizes  # batch size -> engine calls
    engine_calls = sum(sizes.values())
    await core.drain(0.0)
    loop_task.cancel()
    await asyncio.gather(loop_task, return_exceptions=True)
    for task in list(core._tasks):
        task.cancel()
    await r.aclose()
    turns = total * (args.tool_turns + 1)
    return {"arm": arm, "wall_s": wall_s, "turns_per_s": turns / wall_s, "cycles": gaps,
            # The engine costs engine_ms per call whatever its batch: rows that arrive
            # apart (the endpoint's latency spreads them) cost more calls.
            "engine_calls": engine_calls,
            "mean_batch": round(sum(k * v for k, v in sizes.items()) / max(engine_calls, 1), 2),
            "window_waits": core.window.num_waits,
            "window_mean_ms": round(core.window.waited_s * 1000 / max(core.window.num_waits, 1),
                                    2),
            "agents_cpu_share": round(cpu["agents"] / max(
                cpu["rollout"] + cpu["endpoint"] + cpu["agents"], 1e-9), 3),
            "cpu_ms_per_turn": {k: round(v * 1000 / turns, 2) for k, v in cpu.items()}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=32)
    # One episode per agent: both arms then hold the same 32 trajectories at once.
    parser.add_argument("--episodes-per-agent", type=int, default=1)
    parser.add_argument("--tool-turns", type=int, default=4)
    parser.add_argument("--engine-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-ms", type=float, default=50.0,
                        help="task.episode_batch_window_ms of the external arm (the "
                        "external_nowindow arm runs with 0)")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms to run, of {', '.join(ARMS)}")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--client", choices=("openai", "raw"), default="openai",
                        help="the agents' HTTP client: the openai package, or a raw "
                        "keep-alive connection (separates our cost from the client's)")
    parser.add_argument("--profile", default="",
                        help="a folder: cProfile the endpoint process (endpoint.prof, "
                        "all arms) and the rollout in the external arm (rollout.prof)")
    args = parser.parse_args()
    from tests.fixtures.hf_models import make_model_dir

    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    model_dir = make_model_dir("qwen2", tmp / "model")
    redis = start_redis(tmp / "redis", appendonly=False)
    port = free_port()
    serve = [sys.executable, PROCS, "--serve", str(port), redis.url]
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        serve.append(str(Path(args.profile) / "endpoint.prof"))
    server = subprocess.Popen(serve)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url)
        runs = []
        load_start = os.getloadavg()[0]
        chosen = [arm for arm in args.arms.split(",") if arm]
        for round_index in range(args.rounds):
            # Alternate the order, so a drift in the machine's load hits every arm alike.
            arms = chosen if round_index % 2 == 0 else chosen[::-1]
            for arm in arms:
                runs.append(asyncio.run(run_arm(arm, redis.url, model_dir, args, url,
                                                server.pid)))
    finally:
        server.terminate()  # our own child, by pid
        server.wait()
        redis.stop()
    report = summarize(runs, args, chosen)
    report["load_avg_1m_start"] = round(load_start, 1)
    print(json.dumps(report, indent=2) if args.json else "\n".join(
        f"{k}: {v}" for k, v in report.items()))
    return 0


def _wait_http(url: str) -> None:
    import httpx

    for _ in range(300):
        try:
            httpx.get(f"{url}/v1/models", timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the endpoint did not start")


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace,
              arms: list[str]) -> dict[str, Any]:
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in arms}
    cycles = {arm: [c for r in rs for c in r["cycles"]] for arm, rs in by_arm.items()}
    rate = {arm: statistics.mean(r["turns_per_s"] for r in rs) for arm, rs in by_arm.items()}
    out: dict[str, Any] = {"agents": args.agents, "episodes": args.agents * args.episodes_per_agent,
                           "tool_turns": args.tool_turns, "engine_ms": args.engine_ms,
                           "rounds": args.rounds, "cpus": os.cpu_count(),
                           "client": args.client, "window_ms": args.window_ms,
                           "load_avg_1m": round(os.getloadavg()[0], 1)}
    for arm in arms:
        out[f"{arm}_cycle_p50_ms"] = round(pct(cycles[arm], 0.5) * 1000, 2)
        out[f"{arm}_cycle_p99_ms"] = round(pct(cycles[arm], 0.99) * 1000, 2)
        out[f"{arm}_turns_per_s"] = round(rate[arm], 2)
        out[f"{arm}_wall_s"] = [round(r["wall_s"], 2) for r in by_arm[arm]]
        out[f"{arm}_cpu_ms_per_turn"] = by_arm[arm][-1]["cpu_ms_per_turn"]
        out[f"{arm}_engine_calls"] = [r["engine_calls"] for r in by_arm[arm]]
        out[f"{arm}_mean_batch"] = [r["mean_batch"] for r in by_arm[arm]]
        if arm != "internal":
            out[f"{arm}_window_waits"] = [r["window_waits"] for r in by_arm[arm]]
            out[f"{arm}_window_mean_ms"] = [r["window_mean_ms"] for r in by_arm[arm]]
            out[f"{arm}_agents_cpu_share"] = [r["agents_cpu_share"] for r in by_arm[arm]]
    if "internal" not in arms:
        return out
    for arm in (a for a in arms if a != "internal"):
        suffix = "" if arm == "external" else arm.removeprefix("external")
        out[f"added_p50_ms{suffix}"] = round(
            out[f"{arm}_cycle_p50_ms"] - out["internal_cycle_p50_ms"], 2)
        out[f"added_p99_ms{suffix}"] = round(
            out[f"{arm}_cycle_p99_ms"] - out["internal_cycle_p99_ms"], 2)
        out[f"throughput_ratio{suffix}"] = round(rate[arm] / rate["internal"], 3)
    return out


if __name__ == "__main__":
    sys.exit(main())
