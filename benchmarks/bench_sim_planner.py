"""Planner decision time for a 1,000-GPU cluster description (target <= 200 ms).

Builds the planner for 125 nodes x 8 H100 with Qwen3-14B, a 4,096-record length
history (R2E-like) and 1,280 requests per step, then times ``decide`` on a step whose
interval trigger fires (full search + greedy refinement).

Usage: ``python benchmarks/bench_sim_planner.py [--json] [--repeats N]``

``benchmarks/bench_planner.py`` is the fuller measurement (48 and 1,000 GPUs, a history
that changes every step, observe + decide, p50/p99).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling.planner import (  # noqa: E402
    ClusterShape,
    GlobalResourcePlanner,
    PlannerConfig,
    PlanSearch,
    RequestStats,
    SearchSpace,
    StepMetrics,
)
from sim.generators import GeneratorConfig, generate  # noqa: E402
from sim.presets import cluster  # noqa: E402
from sim.systems import LIBRA_PATTERNS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    spec = cluster("h100x1000")
    trace = generate(GeneratorConfig(shape="r2e", num_steps=4, prompts_per_step=320))
    history = [RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s) for t in trace][:4096]
    search = PlanSearch(
        spec.hardware,
        spec.model,
        ClusterShape(spec.num_nodes, 8),
        SearchSpace(node_patterns=LIBRA_PATTERNS),
    )
    config = PlannerConfig(
        plan_interval_steps=1, warmup_steps=0, cooldown_steps=0, pipeline_depth=5
    )
    planner = GlobalResourcePlanner(search, config)
    planner.add_history(history)
    t0 = time.perf_counter()
    planner.preflight(1280)
    preflight_ms = (time.perf_counter() - t0) * 1000
    times = []
    for step in range(1, args.repeats + 1):
        planner.observe(
            StepMetrics(step=step, rollout_s=100.0, train_s=80.0, requests_per_step=1280)
        )
        t0 = time.perf_counter()
        event = planner.decide(step)
        times.append((time.perf_counter() - t0) * 1000)
        assert event.fired
    out = {
        "gpus": spec.num_gpus,
        "history": len(history),
        "preflight_ms": round(preflight_ms, 1),
        "decide_ms_median": round(statistics.median(times), 1),
        "decide_ms_max": round(max(times), 1),
        "target_ms": 200,
        "plan": planner.current.to_dict() if planner.current else None,
    }
    print(
        json.dumps(out, indent=2)
        if args.json
        else f"planner decide on {out['gpus']} GPUs: median {out['decide_ms_median']} ms, "
        f"max {out['decide_ms_max']} ms (preflight {out['preflight_ms']} ms; target <= 200 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
