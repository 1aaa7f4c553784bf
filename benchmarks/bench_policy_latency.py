"""In-process decision latency of C-MLFQ ``on_tool_return``.

Builds a prefix tree from 5,000 synthetic finished trajectories, then drives fresh
trajectories through begin -> tool returns -> finish against 8 instances, applying the
load deltas as the scheduler would, and times every ``on_tool_return`` call. Finishes
are interleaved, so cached P90s are invalidated as in steady state and the recompute
cost shows up in the tail. Target: p99 <= 50 us.

Usage: ``python benchmarks/bench_policy_latency.py [--json] [--trajectories N]``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from libra.types import (  # noqa: E402
    Bucket,
    InstanceId,
    InstanceLoad,
    PromptId,
    SizeClass,
    ToolReturnState,
    ToolStatus,
    TrajectoryId,
)
from scheduling.policy import (  # noqa: E402
    BucketLayout,
    CmlfqConfig,
    CmlfqPolicy,
    InMemoryPolicyStore,
    TrajectoryDescriptor,
)

NUM_PROMPTS = 500
MAX_TOOL_CALLS = 12
STATES = [
    ToolReturnState(tool, size, status)
    for tool in ("web_search", "code_executor", "r2e_issue_validator")
    for size in SizeClass
    for status in ToolStatus
]


def make_layout() -> BucketLayout:
    """The Qwen3-14B R2E 48-GPU bucket layout (digest section 3.5), cap 64."""
    return BucketLayout(
        [
            Bucket("short", 4_000, tp_degree=1, max_trajectories_per_instance=64),
            Bucket("medium", 12_000, tp_degree=2, max_trajectories_per_instance=64),
            Bucket("long", 30_000, tp_degree=4, max_trajectories_per_instance=64),
        ]
    )


def make_instances() -> list[InstanceLoad]:
    """Per node [TP1, TP1, TP2, TP4] x 2 nodes."""
    buckets = ["short", "short", "medium", "long"] * 2
    return [InstanceLoad(InstanceId(f"i{i}"), bucket, 0) for i, bucket in enumerate(buckets)]


def synthetic_episode(rng: random.Random) -> tuple[list[ToolReturnState], list[int], int]:
    """A path of skewed tool states, its token positions and its total length."""
    num_calls = rng.randint(1, MAX_TOOL_CALLS)
    path = [STATES[min(int(rng.expovariate(0.4)), len(STATES) - 1)] for _ in range(num_calls)]
    positions, position = [], 0
    for state in path:
        position += rng.randint(100, 1_500) * (3 if state.status is not ToolStatus.SUCCESS else 1)
        positions.append(position)
    return path, positions, position + rng.randint(0, 8_000)


def apply(instances: dict[str, InstanceLoad], deltas: tuple[tuple[str, int], ...]) -> None:
    """What the scheduler does with ``load_deltas`` (HINCRBY in the service)."""
    for instance_id, delta in deltas:
        instances[instance_id].active_trajectories += delta


def run_episode(
    policy: CmlfqPolicy,
    instances: dict[str, InstanceLoad],
    rng: random.Random,
    trajectory_id: str,
    timings_ns: list[int] | None,
) -> None:
    """Begin, tool returns (timed if ``timings_ns`` is given), finish."""
    snapshot = list(instances.values())
    descriptor = TrajectoryDescriptor(
        TrajectoryId(trajectory_id), PromptId(f"p{rng.randrange(NUM_PROMPTS)}")
    )
    placement = policy.begin(descriptor, snapshot)
    apply(instances, placement.load_deltas)
    path, positions, total_tokens = synthetic_episode(rng)
    for state, position in zip(path, positions, strict=True):
        start_ns = time.perf_counter_ns()
        decision = policy.on_tool_return(descriptor.trajectory_id, state, position, snapshot)
        elapsed_ns = time.perf_counter_ns() - start_ns
        if timings_ns is not None:
            timings_ns.append(elapsed_ns)
        apply(instances, decision.load_deltas)
    apply(instances, policy.finish(descriptor.trajectory_id, total_tokens).load_deltas)


def percentile_us(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1_000


def main() -> None:
    """Build the tree, time decisions, print p50/p99."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--trajectories", type=int, default=5_000, help="tree size (finished trajectories)"
    )
    parser.add_argument("--measured", type=int, default=3_000, help="timed trajectories")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    policy = CmlfqPolicy(make_layout(), InMemoryPolicyStore(), CmlfqConfig())
    instances = {i.instance_id: i for i in make_instances()}
    for n in range(args.trajectories):
        run_episode(policy, instances, rng, f"warm-{n}", None)
    timings_ns: list[int] = []
    for n in range(args.measured):
        run_episode(policy, instances, rng, f"timed-{n}", timings_ns)
    timings_ns.sort()
    stats = policy.stats()
    result = {
        "tree_trajectories": args.trajectories,
        "tree_nodes": stats["tree_nodes"],
        "decisions": len(timings_ns),
        "moves": stats.get("moves", 0),
        "p50_us": round(percentile_us(timings_ns, 0.50), 2),
        "p99_us": round(percentile_us(timings_ns, 0.99), 2),
        "mean_us": round(statistics.fmean(timings_ns) / 1_000, 2),
        "max_us": round(timings_ns[-1] / 1_000, 2),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"C-MLFQ on_tool_return over a tree of {result['tree_trajectories']} trajectories "
        f"({result['tree_nodes']} nodes), {result['decisions']} decisions, {result['moves']} moves"
    )
    print(
        f"p50 {result['p50_us']} us  p99 {result['p99_us']} us  mean {result['mean_us']} us  "
        f"max {result['max_us']} us  (target p99 <= 50 us)"
    )


if __name__ == "__main__":
    main()
