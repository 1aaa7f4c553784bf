"""How much any online replanner could gain on a workload: the best static plan against
the best two-phase schedule, both chosen with the trace in hand (issue 20, session 18).

Issue 20 asks libra to beat the best peer at its own best static split by 15% on the
drifting workloads. libra and the oracle peer run the same uniform TP8 layout, on
which C-MLFQ routes as least-loaded does (docs/simulator.md, session 15), so what libra
could add there is changing its plan during the run. This bounds that gain from above
for a class of schedules: per (workload, seed) and node pattern, every split run
statically, and every schedule that starts on one split and moves to another after
training step k (``--moves 2``: and again after a later step), each move carried out
by the system's own reconfigure strategy (``sim.replan.apply_plan``, paying what it
pays in the simulator). Both bests are hindsight choices per seed, which no planner
has; their ratio is the most a planner that moves that often, at those steps, could
gain over the best static plan of the same policy. With several
``--patterns`` and no ``--switch-after`` it is the policy's own oracle sweep: whether
a mix of TP degrees beats uniform nodes at any split.

The runs use the system's policy with its planner and elastic pool off, so only the
scripted schedule changes the cluster. Throughput is whole-run (trajectories over the
makespan): the steady window (``sim.run.steady_throughput``) opens when the fill's last
training step ends, so a move during the fill shifts the window and inflates its rate
(measured: up to 1.34x on search-drift for a move after step 3), an artefact, not a gain.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_replan_headroom.py \\
        [--workloads r2e-drift,search-drift,math-drift] [--seeds 0,1,2] \\
        [--systems libra,stream-lb] [--patterns 8] [--switch-after 5,10,15] \\
        [--moves 1|2] [--jobs 2] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import math
import statistics
from dataclasses import replace
from typing import Any

PATTERNS = "8"
"""Default node patterns: uniform TP8, the layout of libra's plans and of the oracle
peer on every held-out workload (sessions 15-17)."""


def static_system(name: str) -> Any:
    """``name``'s configuration with its planner and elastic pool off."""
    from sim.systems import system

    base = system(name)
    return replace(
        base, enable_replan=False, enable_elastic=False, planner_twin=False,
        planner_config=replace(base.planner_config, enable_online=False, enable_elastic=False),
    )


Task = tuple[str, str, int, tuple[int, ...], int, tuple[tuple[int, int], ...]]
"""(system, workload, seed, node pattern, first split, moves): each move is (after
training step, training GPUs), in step order; no moves is a static plan."""


def scheduled_throughput(task: Task) -> float | None:
    """Trajectories/s (over the makespan) of the task's system on one trace, starting on
    its first split and moving after each move's step to its split, every rollout node
    of the pattern; ``None`` when infeasible."""
    from sim import replan, rl_loop
    from sim.engine import Simulator
    from sim.instance import SimInfeasible
    from sim.paper import SCALES, _trace
    from sim.presets import cluster
    from sim.run import static_plan

    name, workload, seed, pattern, first_split, moves = task
    scale = SCALES[48]
    spec, trace = cluster(scale["cluster"]), _trace(scale, workload, seed)
    fitted = static_system(name).fitting(
        spec.hardware, spec.model, max(t.total_tokens for t in trace)
    )
    first = fitted.with_split(first_split, pattern, "headroom")
    sim = Simulator(spec, trace, first, static_plan(spec, first))
    try:
        rl_loop.release_allowed(sim, 0.0)
        for after_step, split in moves:
            sim.run_until(math.inf, after_step)
            plan = static_plan(spec, fitted.with_split(split, pattern, "headroom"))
            replan.apply_plan(sim, plan, sim.clock.t)
        sim.run_until(math.inf)
    except SimInfeasible:
        return None
    if sim.batches.consumed < len(trace):
        return None
    last = sim.trainer.log[-1]
    return len(trace) / (last["start_s"] + last["train_s"])


def schedules(
    splits: tuple[int, ...], switch_after: list[int], max_moves: int
) -> list[tuple[int, tuple[tuple[int, int], ...]]]:
    """(first split, moves) of every static plan and every schedule of 1..``max_moves``
    moves at increasing steps from ``switch_after``, each to a different split."""
    out: list[tuple[int, tuple[tuple[int, int], ...]]] = [(a, ()) for a in splits]
    for count in range(1, max_moves + 1):
        for steps in itertools.combinations(sorted(set(switch_after)), count):
            for path in itertools.product(splits, repeat=count + 1):
                if all(x != y for x, y in itertools.pairwise(path)):
                    out.append((path[0], tuple(zip(steps, path[1:], strict=True))))
    return out


def _tasks(args: argparse.Namespace, splits: tuple[int, ...]) -> list[Task]:
    cells = itertools.product(args.systems, args.workloads, args.seeds, args.patterns)
    plans = schedules(splits, args.switch_after, args.moves)
    return [(name, workload, seed, pattern, first, moves)
            for name, workload, seed, pattern in cells for first, moves in plans]


def summarise(tasks: list[Task], results: list[float | None]) -> list[dict[str, Any]]:
    """Per (system, workload): each seed's best static plan and best schedule (a static
    plan, or moves where they are faster: a planner may always keep its plan)."""
    by_cell: dict[tuple[str, str], dict[int, list[tuple[float, Task]]]] = {}
    for task, value in zip(tasks, results, strict=True):
        if value is not None:
            name, workload, seed = task[:3]
            by_cell.setdefault((name, workload), {}).setdefault(seed, []).append((value, task))
    rows = []
    for (name, workload), seeds in by_cell.items():
        per_seed = []
        for seed, runs in sorted(seeds.items()):
            static = max((r for r in runs if not r[1][5]), key=lambda r: r[0])
            best = max(runs, key=lambda r: r[0])
            by_pattern: dict[str, float] = {}
            for value, task in runs:
                if not task[5]:
                    key = ",".join(map(str, task[3]))
                    by_pattern[key] = max(by_pattern.get(key, 0.0), value)
            per_seed.append({
                "seed": seed, "static": static[0], "static_plan": _plan_text(static[1]),
                "best": best[0], "best_plan": _plan_text(best[1]),
                "headroom": best[0] / static[0], "static_by_pattern": by_pattern,
            })
        rows.append({
            "system": name, "workload": workload, "seeds": per_seed,
            "mean_headroom": statistics.mean(s["headroom"] for s in per_seed),
            "max_headroom": max(s["headroom"] for s in per_seed),
        })
    return rows


def _plan_text(task: Task) -> str:
    """``16 x [8]`` or ``16 -> 24 after step 15 x [8]``."""
    pattern, first, moves = task[3], task[4], task[5]
    split = f"{first}" + "".join(f" -> {split} after step {step}" for step, split in moves)
    return f"{split} x {list(pattern)}"


def _ints(parser: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """Comma-separated integers ('' is none); a parser error naming ``option`` otherwise."""
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        parser.error(f"{option}: expected comma-separated integers, got {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="r2e-drift,search-drift,math-drift",
                        help="workloads (default: the three drift variants)")
    parser.add_argument("--seeds", default="0,1,2", help="trace seeds (default 0,1,2: tuning)")
    parser.add_argument("--systems", default="libra,stream-lb",
                        help="systems whose policy runs the schedules (default libra,stream-lb)")
    parser.add_argument("--patterns", default=PATTERNS,
                        help="node patterns, ';'-separated, each its TP degrees "
                        "(default '8': uniform TP8; e.g. '8;4,4;1,1,2,4')")
    parser.add_argument("--switch-after", default="5,10,15",
                        help="training steps after which the second split starts "
                        "(default 5,10,15; '' for static plans only)")
    parser.add_argument("--moves", type=int, default=1,
                        help="most moves per schedule, 1 or 2 (default 1; 2 runs ~4x more)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    from sim.generators import workload_config
    from sim.presets import cluster
    from sim.sweep import split_choices
    from sim.systems import system

    args.workloads = args.workloads.split(",")
    args.systems = args.systems.split(",")
    args.seeds = _ints(parser, "--seeds", args.seeds)
    args.switch_after = _ints(parser, "--switch-after", args.switch_after)
    args.patterns = [tuple(_ints(parser, "--patterns", p)) for p in args.patterns.split(";")]
    try:
        for workload in args.workloads:
            workload_config(workload)
        for name in args.systems:
            system(name)
    except (ValueError, KeyError) as exc:
        parser.error(str(exc))
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.moves not in (1, 2):
        parser.error(f"--moves must be 1 or 2, got {args.moves}")
    if any(k < 1 for k in args.switch_after):
        parser.error(f"--switch-after: every step must be >= 1, got {args.switch_after}")
    spec = cluster("a800x48")
    for pattern in args.patterns:
        if not pattern or sum(pattern) != spec.gpus_per_node or min(pattern) < 1:
            parser.error(f"--patterns: {list(pattern)} does not fill a "
                         f"{spec.gpus_per_node}-GPU node")
    splits = split_choices(spec)
    tasks = _tasks(args, splits)
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(scheduled_throughput, tasks, chunksize=4))
    rows = summarise(tasks, results)
    if args.json:
        print(json.dumps({"splits": splits, "rows": rows}, indent=1))
        return
    for row in rows:
        cells = "; ".join(
            f"seed {s['seed']} {s['static']:.3f} ({s['static_plan']}) -> {s['best']:.3f} "
            f"({s['best_plan']})" for s in row["seeds"]
        )
        print(f"{row['system']} {row['workload']}: headroom mean {row['mean_headroom']:.3f}x, "
              f"max {row['max_headroom']:.3f}x; {cells}")
        if len(args.patterns) > 1:
            ratios = "; ".join(
                f"[{key}] " + " ".join(
                    f"{s['static_by_pattern'].get(key, 0.0) / s['static']:.3f}"
                    for s in row["seeds"]
                )
                for key in row["seeds"][0]["static_by_pattern"]
            )
            print(f"    best static per pattern over the best static plan, per seed: {ratios}")

if __name__ == "__main__":
    main()
