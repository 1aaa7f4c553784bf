"""The planner twin's prediction at later decisions, on drifting workloads (issue 20,
session 14 lever 2): with and without the length trend.

Per workload and seed: libra's preflight plan runs statically over the whole trace.
At each decision step K (after training step K-1 ends, as ``sim.replan.run_planner``
sees it) two twins are fed what the run had by then:

- ``old``: the last pipeline depth of *consumed batches*, replayed as observed (the
  twin before session 14);
- ``steps``: the last pipeline depth of complete release steps (every trajectory
  finished), replayed as observed;
- ``new``: the same, scaled by the length trend to the newest released step
  (``sim.twin``, the default).

Each ranks the search's candidates (closed-form top 3, the best uniform plan and each
top split's best homogeneous layout, from the consumed history). Reference per
candidate: the whole trace simulated statically at it, the mean step interval over the
plan's tenure (steps K .. K + plan interval - 1).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_twin_drift.py [--seeds 10,11,12]
        [--workloads r2e-drift,search-drift,math-drift] [--decisions 5,10] [--json]
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
from sim.generators import generate, workload_config
from sim.presets import cluster
from sim.run import initial_plan
from sim.systems import system
from sim.twin import TwinRefiner

SPEC = cluster("a800x48")


def _ends(raw: dict[str, Any]) -> list[float]:
    return [r["start_s"] + r["train_s"] for r in raw["train_log"]]


def _tenure_s(ends: list[float], k: int, interval: int) -> float:
    """Mean step interval over steps k .. k + interval - 1 (from the end of step k-1)."""
    return (ends[k - 1 + interval] - ends[k - 1]) / interval


def _feed(sim: Simulator, k: int, ends: list[float]) -> tuple[dict[str, TwinRefiner], list]:
    """The three twins as they stood after training step k-1, and the history."""
    libra = system("libra")
    now = ends[k - 1]
    old, new = TwinRefiner(SPEC, libra, trend=False), TwinRefiner(SPEC, libra)
    steps = TwinRefiner(SPEC, libra, trend=False)
    batches = list(sim.consumed.values())[:k]
    for batch in batches[-pipeline_depth(libra.staleness):]:
        old.observe_step([t.rec for t in batch])
    for step in sim.steps:
        if any(t.finished_s < 0 or t.finished_s > now for t in sim.by_step[step]):
            break
        new.observe_step([t.rec for t in sim.by_step[step]])
        steps.observe_step([t.rec for t in sim.by_step[step]])
    new.observe_release(max(s for s, at in sim.release_s.items() if at <= now))
    history = [RequestStats(t.rec.prompt_tokens, t.rec.post_prompt_tokens, t.rec.tool_s)
               for b in batches for t in b]
    return {"old": old, "steps": steps, "new": new}, history


def measure(workload: str, seed: int, decisions: list[int]) -> list[dict[str, Any]]:
    trace = generate(workload_config(workload, num_steps=20, prompts_per_step=16, seed=seed))
    libra = system("libra")
    static = replace(libra, enable_replan=False, enable_elastic=False)
    plan0 = initial_plan(SPEC, trace, libra)[0]
    sim = Simulator(SPEC, trace, static, plan0, None)
    ends = _ends(sim.run())
    interval = libra.planner_config.plan_interval_steps
    simulated: dict[tuple, list[float]] = {}
    rows = []
    for k in decisions:
        twins, history = _feed(sim, k, ends)
        search = PlanSearch(SPEC.hardware, SPEC.model, ClusterShape(SPEC.num_nodes, 8),
                            SearchSpace(node_patterns=libra.node_patterns, train_tp=8))
        work = Workload(64, tuple(history), pipeline_depth(libra.staleness))
        model = search.cost_model(work)
        cands = search._closed_form_top_k(model, work, 1.0, 1.0)
        cands += search._best_uniform(model, work, cands)
        cands += search._homogeneous_per_split(model, work, cands)
        if plan0.key() not in {c.plan.key() for c in cands}:
            cands.append(replace(cands[0], plan=plan0, train_s=search.train_s(plan0.train, work)))
        for cand in cands:
            key = cand.plan.key()
            if key not in simulated:
                simulated[key] = _ends(Simulator(SPEC, trace, static, cand.plan, None).run())
            rows.append({
                "workload": workload, "seed": seed, "decision_step": k,
                "train_gpus": cand.plan.train_gpus,
                "rollout_tps": cand.plan.to_dict()["rollout_tps"],
                "in_force": key == plan0.key(),
                **{f"{name}_s": max(cand.train_s, twin.rollout_s(cand.plan, work))
                   for name, twin in twins.items()},
                "length_scale": twins["new"].length_scale(),
                "simulated_s": _tenure_s(simulated[key], k, interval),
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="10,11,12")
    parser.add_argument("--workloads", default="r2e-drift,search-drift,math-drift")
    parser.add_argument("--decisions", default="5,10")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.process_time()
    rows = [r for w in args.workloads.split(",") for s in args.seeds.split(",")
            for r in measure(w, int(s), [int(k) for k in args.decisions.split(",")])]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for w in args.workloads.split(","):
        sel = [r for r in rows if r["workload"] == w]
        for label in ("old", "steps", "new"):
            ratios = [r[f"{label}_s"] / r["simulated_s"] for r in sel]
            within = sum(1 for x in ratios if abs(x - 1) <= 0.15)
            print(f"{w:13} {label}: within +-15% {within}/{len(ratios)}, median "
                  f"twin/sim {statistics.median(ratios):.2f}, range {min(ratios):.2f}-"
                  f"{max(ratios):.2f}")
        print(f"{w:13} length scale at decisions: "
              + ", ".join(f"{r['length_scale']:.2f}" for r in sel if r["in_force"]))
    print(f"CPU {time.process_time() - started:.0f} s, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
