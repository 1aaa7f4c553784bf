"""Speed of the planner twin and the simulator, arms alternated (issue 20, session 15).

Each arm is a source tree (this one by default; pass a base-tree worktree to compare)
and a number of twin worker processes (``--twin-workers``, session 18; a tree before
session 18 runs only 1). Rounds alternate the arms, each in a fresh child process run
from its tree, so a load change on the shared machine hits every arm alike. Per arm:

- decision time: one ``PlanSearch.search`` with an empty twin cache at 48 GPUs (or
  ``--gpus 1000``, session 19), after 5 observed steps, for 3 workloads x the seeds
  (CPU and wall seconds, twin runs, the plan picked and its score; the
  CPU is the deciding process's, so with workers the wall time is the figure, and the
  workers are started before the clock starts, as a run starts them once);
- one simulated run (``--cell``, default ``libra`` on held-out r2e seed 10 at 48 GPUs),
  its CPU seconds and throughput (equal throughput across arms: the same results);
- with ``--in-runs`` (session 19), every planner decision inside whole libra runs of
  the same workloads and seeds that ran the twin: what a decision costs in a run,
  where it also scores the plan in force and judges the elastic pool's borrows (the
  search alone, above, under-states it), with each run's throughput.

CPU seconds are steadier than wall time under shared load; the load average is printed
beside them. Wall time with workers needs as many free cores: on a shared 2-core host
it is a measure only while nothing else runs.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_sim_speed.py \\
        --arms /work/wt-s15-base,. [--twin-workers 1,2] [--rounds 2] [--seeds 0,1,2]
        [--gpus 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHAPES = ("r2e", "search", "math")
HISTORY_STEPS = 5


def observed_steps(config: Any) -> list[list[Any]]:
    """The first ``HISTORY_STEPS`` steps of the trace ``config`` (a ``GeneratorConfig``)
    generates: what the twin has observed at the decision."""
    from sim.generators import generate

    trace = generate(config)
    return [[t for t in trace if t.step == step] for step in range(HISTORY_STEPS)]


def decision_setup(config: Any, workers: int = 1, gpus: int = 48) -> tuple[Any, Any, Any]:
    """One decision at ``gpus`` GPUs (``sim.paper.SCALES``), ready to search: the twin (on
    ``workers`` processes) after ``observed_steps``, and the search over it; (search,
    workload, twin). profile_decision.py profiles the same."""
    from scheduling.planner import (
        ClusterShape,
        PlanSearch,
        RequestStats,
        SearchSpace,
        Workload,
        pipeline_depth,
    )
    from sim.paper import SCALES
    from sim.presets import cluster
    from sim.systems import system
    from sim.twin import TwinRefiner

    spec, libra = cluster(SCALES[gpus]["cluster"]), system("libra")
    # A tree before session 18 has no ``workers``: this file runs against every arm's tree.
    twin = TwinRefiner(spec, libra) if workers == 1 else TwinRefiner(spec, libra, workers=workers)
    history: list[Any] = []
    batch: list[Any] = []
    for batch in observed_steps(config):
        twin.observe_step(batch)
        history += [RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s)
                    for t in batch]
    search = PlanSearch(spec.hardware, spec.model, ClusterShape(spec.num_nodes, 8),
                        SearchSpace(node_patterns=libra.node_patterns, train_tp=8),
                        refiner=twin)
    return search, Workload(len(batch), tuple(history), pipeline_depth(libra.staleness)), twin


def _decisions(seeds: list[int], workers: int, gpus: int) -> list[dict[str, Any]]:
    """Decision time of one search per (workload, seed), in this process's tree."""
    from sim.generators import GeneratorConfig
    from sim.paper import SCALES

    scale = SCALES[gpus]
    out = []
    for shape in SHAPES:
        for seed in seeds:
            search, work, twin = decision_setup(GeneratorConfig(
                shape=shape, num_steps=scale["num_steps"],
                prompts_per_step=scale["prompts_per_step"], seed=seed), workers, gpus)
            if workers > 1:  # a tree before session 18 has no workers to start or close
                twin.start_workers()
            wall, cpu = time.perf_counter(), time.process_time()
            best = search.search(work)
            out.append({"shape": shape, "seed": seed, "cpu_s": time.process_time() - cpu,
                        "wall_s": time.perf_counter() - wall, "twin_runs": twin.runs,
                        "plan": str(best.plan.key()), "rollout_s": best.rollout_s})
            if workers > 1:
                twin.close()
    return out


def _cell(spec_text: str) -> dict[str, Any]:
    """One simulated run: ``workload:seed:gpus:system``."""
    from sim.paper import SCALES, _trace
    from sim.presets import cluster
    from sim.run import run
    from sim.systems import system

    shape, seed, gpus, name = spec_text.split(":")
    scale = SCALES[int(gpus)]
    trace = _trace(scale, shape, int(seed))
    cpu = time.process_time()
    result = run(cluster(scale["cluster"]), trace, system(name))
    return {"cell": spec_text, "cpu_s": time.process_time() - cpu,
            "throughput_traj_per_s": result["throughput_traj_per_s"]}


def _run_decisions(shape: str, seed: int, workers: int, gpus: int) -> dict[str, Any]:
    """Every decision of one whole libra run that ran the twin: wall and CPU seconds and
    twin runs each, and the run's throughput."""
    from sim.engine import Simulator
    from sim.paper import SCALES, _trace
    from sim.presets import cluster
    from sim.run import initial_plan
    from sim.systems import system

    scale = SCALES[gpus]
    spec, trace = cluster(scale["cluster"]), _trace(scale, shape, seed)
    libra = system("libra").fitting(spec.hardware, spec.model, max(t.total_tokens for t in trace))
    plan, planner, _, twin = initial_plan(spec, trace, libra, workers)
    decide, timed = planner.decide, []

    def timed_decide(step: int) -> Any:
        runs, wall, cpu = twin.runs, time.perf_counter(), time.process_time()
        event = decide(step)
        if twin.runs > runs:
            timed.append({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                          "twin_runs": twin.runs - runs})
        return event

    planner.decide = timed_decide  # this run's planner only
    try:
        raw = Simulator(spec, trace, libra, plan, planner, twin=twin).run()
    finally:
        twin.close()
    return {"shape": shape, "seed": seed, "decisions": timed,
            "throughput_traj_per_s": len(trace) / raw["makespan_s"]}


def _worker(args: argparse.Namespace) -> None:
    seeds = [int(s) for s in args.seeds.split(",")]
    workers = args.twin_workers[0]
    out: dict[str, Any] = {"decisions": _decisions(seeds, workers, args.gpus)}
    if args.in_runs:
        out["runs"] = [_run_decisions(shape, seed, workers, args.gpus)
                       for shape in SHAPES for seed in seeds]
    if args.cell:
        out["cell"] = _cell(args.cell)
    out["load"] = os.getloadavg()[0]
    print(json.dumps(out))


def _run_arm(tree: Path, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--seeds", args.seeds,
           "--twin-workers", str(workers), "--gpus", str(args.gpus)]
    cmd += ["--in-runs"] if args.in_runs else []
    cmd += ["--cell", args.cell]  # '' too: the worker's default is a cell
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = [d["cpu_s"] for r in rounds for d in r["decisions"]]
    wall = [d["wall_s"] for r in rounds for d in r["decisions"]]
    runs = [d["twin_runs"] for r in rounds for d in r["decisions"]]
    out = {
        "decision_cpu_median_s": statistics.median(cpu), "decision_cpu_max_s": max(cpu),
        "decision_wall_median_s": statistics.median(wall), "decision_wall_max_s": max(wall),
        "twin_runs": [min(runs), max(runs)],
        "picked_plans": [d["plan"] for d in rounds[0]["decisions"]],
        "picked_rollout_s": [d["rollout_s"] for d in rounds[0]["decisions"]],
        "load": [r["load"] for r in rounds],
    }
    if "runs" in rounds[0]:
        wall = [d["wall_s"] for r in rounds for run in r["runs"] for d in run["decisions"]]
        cpu = [d["cpu_s"] for r in rounds for run in r["runs"] for d in run["decisions"]]
        out["in_runs"] = {
            "decisions": len(wall), "wall_median_s": statistics.median(wall),
            "wall_max_s": max(wall), "cpu_median_s": statistics.median(cpu), "cpu_max_s": max(cpu),
            "throughputs": [run["throughput_traj_per_s"] for run in rounds[0]["runs"]],
        }
    if "cell" in rounds[0]:
        out["cell"] = rounds[0]["cell"]["cell"]
        out["cell_cpu_s"] = [r["cell"]["cpu_s"] for r in rounds]
        out["cell_throughput"] = rounds[0]["cell"]["throughput_traj_per_s"]
    return out


def _worker_counts(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"integers >= 1, got {text!r}")
    return counts


def _arm_name(tree: Path, workers: int) -> str:
    return str(tree) if workers == 1 else f"{tree} x{workers} twin workers"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=".",
                        help="comma-separated source trees, alternated (default: this one)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every arm (default 2)")
    parser.add_argument("--seeds", default="0,1,2", help="workload seeds (default 0,1,2)")
    parser.add_argument("--cell", default="r2e:10:48:libra",
                        help="one run timed per round, workload:seed:gpus:system ('' for none)")
    parser.add_argument("--twin-workers", type=_worker_counts, default=[1],
                        help="twin worker processes per arm, comma-separated (default 1)")
    parser.add_argument("--gpus", type=int, choices=(48, 1000), default=48,
                        help="cluster scale of the decisions (default 48)")
    parser.add_argument("--in-runs", action="store_true",
                        help="also time every decision inside whole libra runs of the "
                        "workloads and seeds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    trees = [Path(t).resolve() for t in args.arms.split(",")]
    for tree in trees:
        if not (tree / "sim" / "twin.py").is_file():
            parser.error(f"--arms: {tree} is not a source tree (no sim/twin.py)")
    arms = [(tree, n) for tree in trees for n in args.twin_workers]
    by_arm: dict[str, list[dict[str, Any]]] = {_arm_name(t, n): [] for t, n in arms}
    for _ in range(args.rounds):
        for tree, n in arms:
            by_arm[_arm_name(tree, n)].append(_run_arm(tree, n, args))
    result = {arm: _summary(rounds) for arm, rounds in by_arm.items()}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    first = next(iter(result.values()))
    for arm, s in result.items():
        same = "same plans" if s["picked_plans"] == first["picked_plans"] else "PLANS DIFFER"
        same += (", same scores" if s["picked_rollout_s"] == first["picked_rollout_s"]
                 else ", scores differ")
        same += " (vs the first arm)"
        line = (f"{arm}: decision CPU median {s['decision_cpu_median_s']:.3f} s, max "
                f"{s['decision_cpu_max_s']:.3f} s (wall median {s['decision_wall_median_s']:.3f}"
                f" s, max {s['decision_wall_max_s']:.3f} s); twin runs "
                f"{s['twin_runs'][0]}-{s['twin_runs'][1]}, {same}; load "
                f"{', '.join(f'{x:.1f}' for x in s['load'])}")
        if "in_runs" in s:
            r = s["in_runs"]
            line += (f"; in runs: {r['decisions']} decisions, wall median {r['wall_median_s']:.3f}"
                     f" s, max {r['wall_max_s']:.3f} s (CPU {r['cpu_median_s']:.3f} / "
                     f"{r['cpu_max_s']:.3f} s), throughputs "
                     f"{', '.join(f'{x:.4f}' for x in r['throughputs'])}")
        if "cell" in s:
            line += (f"; {s['cell']}: CPU {', '.join(f'{x:.1f}' for x in s['cell_cpu_s'])} s, "
                     f"{s['cell_throughput']!r} traj/s")
        print(line)


if __name__ == "__main__":
    main()
