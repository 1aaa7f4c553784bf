"""A planner decision's twin runs spread over processes: wall time against one process
(issue 20, session 17; measured here, not built into the planner).

The twin runs of one decision are independent and deterministic, so on a controller
with free cores a decision could take its slowest run instead of their sum. Per
(workload, seed), as ``bench_sim_speed.py`` times a decision (48 GPUs, 5 observed steps,
an empty twin cache), this runs side by side in one process tree:

- sequential: ``PlanSearch.search`` as the planner runs it;
- parallel: the same candidates by rising training time, in waves of ``--workers``
  unpruned ones scored at once in a process pool, each wave's results then taken in
  order under the search's own pruning rule (so the pick and its score are the
  sequential ones; a run a wave started that the sequential order would have pruned is
  extra CPU, counted).

It prints both wall times, their ratio, the twin runs and whether every pick and score
agree. A pool inside the simulator's own ``--jobs`` workers (daemonic processes cannot
start children) and the cores it takes from them are why this is a benchmark, not a
planner option.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_parallel_decision.py \\
        [--workers 2] [--seeds 0,1,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import time
from typing import Any

SHAPES = ("r2e", "search", "math")


def _setup(shape: str, seed: int) -> tuple[Any, Any, Any, list]:
    """The twin, search and workload of one decision, and the steps the twin observed."""
    from benchmarks.bench_sim_speed import decision_setup, observed_steps
    from sim.generators import GeneratorConfig

    config = GeneratorConfig(shape=shape, num_steps=20, prompts_per_step=16, seed=seed)
    search, work, twin = decision_setup(config)
    return twin, search, work, observed_steps(config)


_SPECS: dict[str, Any] = {}
"""A pool worker's cluster and system, built on its first task."""


def _score(task: tuple[list, Any]) -> float:
    """One twin run in a pool worker: a twin fed the same steps scores ``plan``."""
    from sim.presets import cluster
    from sim.systems import system
    from sim.twin import TwinRefiner

    if not _SPECS:
        _SPECS.update(cluster=cluster("a800x48"), system=system("libra"))
    steps, plan = task
    twin = TwinRefiner(_SPECS["cluster"], _SPECS["system"])
    for batch in steps:
        twin.observe_step(batch)
    return twin.rollout_s(plan, None)


def _parallel(pool: Any, workers: int, search: Any, work: Any, steps: list) -> tuple:
    """(objective, plan key, twin runs) of the search done in waves of ``workers``."""
    model = search.cost_model(work)
    order = sorted(enumerate(search.candidates(model, work)), key=lambda e: e[1].train_s)
    best: tuple[float, int, Any] | None = None
    runs, i = 0, 0
    while i < len(order):
        wave = []
        while i < len(order) and len(wave) < workers:
            index, cand = order[i]
            i += 1
            if best is None or (cand.train_s, index) < best[:2]:
                wave.append((index, cand))
        scores = pool.map(_score, [(steps, cand.plan) for _, cand in wave])
        runs += len(wave)
        for (index, cand), rollout_s in zip(wave, scores, strict=True):
            objective = max(cand.train_s, rollout_s)
            if best is not None and (cand.train_s, index) >= best[:2]:
                continue  # pruned in the sequential order: its run was extra
            if not math.isinf(objective) and (best is None or (objective, index) < best[:2]):
                best = (objective, index, cand.plan.key())
    return (best[0], best[2], runs) if best else (math.inf, None, runs)


def measure(workers: int, seeds: list[int]) -> list[dict[str, Any]]:
    """Both ways per (workload, seed), in this process and a pool of ``workers``."""
    out = []
    _setup(SHAPES[0], seeds[0])  # the modules are imported before the workers fork
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_score, [([], None)] * workers, chunksize=1)  # workers up and built
        for shape in SHAPES:
            for seed in seeds:
                twin, search, work, _ = _setup(shape, seed)
                started = time.perf_counter()
                best = search.search(work)
                sequential_s = time.perf_counter() - started
                _, search2, work2, steps = _setup(shape, seed)
                started = time.perf_counter()
                objective, key, runs = _parallel(pool, workers, search2, work2, steps)
                out.append({
                    "shape": shape, "seed": seed, "sequential_wall_s": sequential_s,
                    "parallel_wall_s": time.perf_counter() - started,
                    "sequential_runs": twin.runs, "parallel_runs": runs,
                    "same": best is not None and (best.objective_s, best.plan.key())
                    == (objective, key),
                })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="pool processes (default 2)")
    parser.add_argument("--seeds", default="0,1,2", help="workload seeds (default 0,1,2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error(f"--workers must be >= 2, got {args.workers}")
    rows = measure(args.workers, [int(s) for s in args.seeds.split(",")])
    seq = [r["sequential_wall_s"] for r in rows]
    par = [r["parallel_wall_s"] for r in rows]
    summary = {
        "workers": args.workers, "load": os.getloadavg()[0],
        "sequential_median_s": statistics.median(seq), "sequential_max_s": max(seq),
        "parallel_median_s": statistics.median(par), "parallel_max_s": max(par),
        "median_ratio": statistics.median(p / s for p, s in zip(par, seq, strict=True)),
        "same_picks": sum(r["same"] for r in rows), "decisions": len(rows),
        "runs": [sum(r["sequential_runs"] for r in rows), sum(r["parallel_runs"] for r in rows)],
    }
    if args.json:
        print(json.dumps({"summary": summary, "decisions": rows}, indent=1))
        return
    print(f"{args.workers} workers: decision wall median {summary['sequential_median_s']:.3f}"
          f" -> {summary['parallel_median_s']:.3f} s, max {summary['sequential_max_s']:.3f} ->"
          f" {summary['parallel_max_s']:.3f} s (median ratio {summary['median_ratio']:.2f});"
          f" same pick and score {summary['same_picks']}/{summary['decisions']}; twin runs"
          f" {summary['runs'][0]} -> {summary['runs'][1]}; load {summary['load']:.1f}")


if __name__ == "__main__":
    main()
