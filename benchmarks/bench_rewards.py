"""Reward throughput per reward kind, through the tool gateway's core in this process.

Scores ``--calls`` trajectories (a 3-turn transcript with two tool calls) per reward,
``--concurrency`` at a time, and prints trajectories/s and the mean latency:
``exact_match``, ``numeric``, ``format``, ``composite`` (exact_match + format), and
``llm_judge`` against a local OpenAI-compatible HTTP server started here (http.server,
answers at once: the figure is the gateway's own cost of a judge call, not a model's).
The judge's rate limit is set far above the load. ``--json`` for machines.

    python -m benchmarks.bench_rewards [--calls 2000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from libra import types as t  # noqa: E402
from libra.rewardspec import LlmJudgeSpec, RewardComponent, RewardSpec  # noqa: E402
from services.toolgateway.core import ScoreRequest, ToolGatewayCore  # noqa: E402
from services.toolgateway.rewards import build_reward_registry  # noqa: E402
from services.toolgateway.sandbox import SandboxConfig, SubprocessSandbox  # noqa: E402
from services.toolgateway.tools import ToolRegistry  # noqa: E402
from tests.fixtures.judge_server import serve_judge  # noqa: E402

MESSAGES = (
    t.TranscriptMessage("user", "What is 12*7+3?"),
    t.TranscriptMessage("assistant", "<calc>12*7</calc>",
                        (t.TranscriptToolCall("calculator", '{"expression": "12*7"}'),)),
    t.TranscriptMessage("tool", "<res>84</res>", name="calculator", tool_status="success"),
    t.TranscriptMessage("assistant", "<calc>84+3</calc>",
                        (t.TranscriptToolCall("calculator", '{"expression": "84+3"}'),)),
    t.TranscriptMessage("tool", "<res>87</res>", name="calculator", tool_status="success"),
    t.TranscriptMessage("assistant", "<ans>87</ans>"))


def _reward_specs(judge_url: str) -> dict[str, RewardSpec]:
    judge = LlmJudgeSpec(base_url=judge_url, model="bench", requests_per_s=1e6)
    return {
        "exact_match": RewardSpec(name="exact_match"),
        "numeric": RewardSpec(name="numeric"),
        "format": RewardSpec(name="format"),
        "composite": RewardSpec(name="composite", components=[
            RewardComponent(name="exact_match"), RewardComponent(name="format", weight=0.2)]),
        "llm_judge": RewardSpec(name="llm_judge", llm_judge=judge),
    }


async def _measure(core: ToolGatewayCore, spec: RewardSpec, calls: int,
                   concurrency: int) -> dict[str, float]:
    options = spec.options()
    slots = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(i: int) -> None:
        async with slots:
            started = time.perf_counter()
            await core.score(ScoreRequest(f"tr-{i}", spec.name, "87", "87",
                                          messages=MESSAGES, num_turns=3, options=options))
            latencies.append(time.perf_counter() - started)

    await one(-1)  # warm-up (the judge's HTTP client connects)
    latencies.clear()
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    wall_s = time.perf_counter() - started
    return {"trajectories_per_s": round(calls / wall_s, 1),
            "mean_latency_ms": round(1000 * sum(latencies) / len(latencies), 3)}


async def run(calls: int, concurrency: int) -> dict[str, dict[str, float]]:
    with serve_judge(lambda _path, _body: "Score: 1") as judge:
        core = ToolGatewayCore(ToolRegistry(), build_reward_registry(
            SubprocessSandbox(SandboxConfig())))
        return {name: await _measure(core, spec, calls, concurrency)
                for name, spec in _reward_specs(judge.url).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="trajectories per reward")
    parser.add_argument("--concurrency", type=int, default=32, help="scores in flight")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    results = asyncio.run(run(args.calls, args.concurrency))
    if args.json:
        print(json.dumps(results))
    else:
        for name, row in results.items():
            print(f"{name:12s} {row['trajectories_per_s']:>10.1f} traj/s   "
                  f"mean latency {row['mean_latency_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
