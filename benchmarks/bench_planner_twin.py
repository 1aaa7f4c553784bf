"""Planner twin vs simulation: predicted and simulated step time of the candidates the
planner ranks, and the decision time (issue 20 item 5).

For each workload and seed: the twin is fed steps 0-4, the search ranks its candidates
(``PlanSearch.candidates``: the closed form's top 3 splits, the best uniform plan, each
top split's homogeneous front, less the mixes not clearly ahead, session 17), each is
scored by the twin and by the closed form, and simulated statically over the whole
20-step trace (mean step interval between the fill and the drain, as
``steady_throughput`` counts). Decision time = one
``PlanSearch.search`` with an empty twin cache (wall and CPU seconds).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_planner_twin.py [--seeds 0,1,2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from typing import Any

from scheduling.planner import (
    ClusterShape,
    PlanSearch,
    RequestStats,
    SearchSpace,
    Workload,
    pipeline_depth,
)
from sim.engine import Simulator
from sim.generators import SHAPES, GeneratorConfig, generate
from sim.presets import cluster
from sim.systems import system
from sim.twin import TwinRefiner, steady_step_s

HISTORY_STEPS = 5



def measure(
    shape: str, seed: int, screen: str = "front", decision_only: bool = False
) -> dict[str, Any]:
    """Per candidate: twin, closed form and simulated step time; and the decision time
    (``screen``: ``SearchSpace.homogeneous_screen``; ``decision_only``: no simulation)."""
    spec = cluster("a800x48")
    trace = generate(GeneratorConfig(shape=shape, num_steps=20, prompts_per_step=16, seed=seed))
    libra = system("libra")
    twin = TwinRefiner(spec, libra)
    history: list[RequestStats] = []
    for step in range(HISTORY_STEPS):
        batch = [t for t in trace if t.step == step]
        twin.observe_step(batch)
        history += [RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s) for t in batch]
    search = PlanSearch(
        spec.hardware, spec.model, ClusterShape(spec.num_nodes, 8),
        SearchSpace(node_patterns=libra.node_patterns, train_tp=8, homogeneous_screen=screen),
        refiner=twin,
    )
    work = Workload(64, tuple(history), pipeline_depth(libra.staleness))
    started, cpu_started = time.perf_counter(), time.process_time()
    search.search(work)
    decision_s = time.perf_counter() - started
    decision_cpu_s = time.process_time() - cpu_started
    decision_runs = twin.runs
    model = search.cost_model(work)
    candidates = [] if decision_only else search.candidates(model, work)
    static = replace(libra, enable_replan=False, enable_elastic=False)
    rows = []
    for cand in candidates:
        raw = Simulator(spec, trace, static, cand.plan, None).run()
        simulated = steady_step_s(raw["train_log"], pipeline_depth(libra.staleness))
        twin_s = max(cand.train_s, twin.rollout_s(cand.plan, work))
        rows.append({
            "train_gpus": cand.plan.train_gpus,
            "rollout_tps": cand.plan.to_dict()["rollout_tps"],
            "twin_s": twin_s, "closed_form_s": cand.objective_s, "simulated_s": simulated,
        })
    return {"shape": shape, "seed": seed, "screen": screen, "decision_s": decision_s,
            "decision_cpu_s": decision_cpu_s, "twin_runs": decision_runs, "pruned": search.pruned,
            "candidates": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--screens", default="front",
                        help="homogeneous screens, comma-separated (alternated per decision)")
    parser.add_argument("--decision-only", action="store_true",
                        help="time the decisions only (no static simulation per candidate)")
    args = parser.parse_args()
    screens = args.screens.split(",")
    results = [measure(s, int(seed), screen, args.decision_only)
               for s in SHAPES for seed in args.seeds.split(",") for screen in screens]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for screen in screens:
        mine = [r for r in results if r["screen"] == screen]
        cpu = [r["decision_cpu_s"] for r in mine]
        runs = [r["twin_runs"] for r in mine]
        print(f"screen {screen}: CPU median {statistics.median(cpu):.3f} s, max {max(cpu):.3f} s; "
              f"twin runs per decision {min(runs)}-{max(runs)} (mean "
              f"{statistics.mean(runs):.1f}); pruned {sum(r['pruned'] for r in mine)}")
    print(f"{'workload':8} {'seed':>4} {'split':>6} {'layout':28} {'twin':>7} {'closed':>7} "
          f"{'sim':>7} {'twin/sim':>8} {'closed/sim':>10}")
    ratios: dict[str, list[float]] = {}
    for res in results:
        for c in res["candidates"]:
            r = c["twin_s"] / c["simulated_s"]
            ratios.setdefault(res["shape"], []).append(r)
            print(f"{res['shape']:8} {res['seed']:4d} {c['train_gpus']:6d} "
                  f"{str(c['rollout_tps']):28} {c['twin_s']:7.1f} {c['closed_form_s']:7.1f} "
                  f"{c['simulated_s']:7.1f} {r:8.2f} {c['closed_form_s'] / c['simulated_s']:10.2f}")
    for shape, rs in ratios.items():
        within = sum(1 for r in rs if abs(r - 1) <= 0.15)
        print(f"{shape}: twin within +-15% on {within}/{len(rs)} candidates, median twin/sim "
              f"{statistics.median(rs):.2f}")
    times = [r["decision_s"] for r in results]
    cpu = [r["decision_cpu_s"] for r in results]
    runs = [r["twin_runs"] for r in results]
    print(f"decision time (search with the twin, 48 GPUs): wall median "
          f"{statistics.median(times):.3f} s, max {max(times):.3f} s; CPU median "
          f"{statistics.median(cpu):.3f} s, max {max(cpu):.3f} s; twin runs per decision "
          f"{min(runs)}-{max(runs)}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
