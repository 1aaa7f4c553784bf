"""The planner twin's resolution of splits (issue 20, session 16): per candidate, the
twin's predicted step interval against the simulated one, at the preflight and at later
decisions, for each twin variant (``TWINS``).

Per workload and seed, at each decision K (0 = the preflight, fed the startup profile
of step 0; K > 0 = after training step K-1 of libra's preflight plan run statically,
fed the complete release steps by then, as ``sim.replan.feed_twin`` does) the search's
candidates (``PlanSearch.candidates``) are scored by each twin variant (its
measurement window and whether replayed prompts are fresh) and simulated statically
over the whole trace. Reference:
at the preflight, the run's steady step interval (``steady_step_s``, what the plan runs
at for the run); later, the mean interval over the plan's tenure (steps K .. K + 4).

Reported per variant: twin/sim within +-15%, the per-split bias (median twin/sim) and
noise (standard deviation of log twin/sim within the split), Spearman's rank correlation between
twin and simulation over each decision's candidates (mean over decisions) and the
regret of the twin's pick (its simulated interval over the best candidate's).

At 1,000 GPUs (``--gpus 1000``, session 19) the twin simulates a slice of the fleet
(``sim.twin_slice``); ``--slice-nodes`` adds a variant per slice size, and ``s16`` is
the whole fleet, so the slice's cost in accuracy is read side by side.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_twin_splits.py [--seeds 0,1,2]
        [--workloads r2e,r2e-drift] [--decisions 0,5,10] [--twins s15,s16] [--json]
        [--gpus 1000 --steps 11 --decisions 5 --slice-nodes 41,31,25]
"""

from __future__ import annotations

import argparse
import json
import math
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
from sim.paper import SCALES
from sim.presets import ClusterSpec, cluster
from sim.run import STARTUP_PROFILE_SIZE, initial_plan
from sim.systems import system
from sim.twin import TwinRefiner, steady_step_s

TWINS: dict[str, dict[str, Any]] = {
    "s15": {"window": "after_fill", "fresh_prompts": False, "slice_nodes": None},
    "steady": {"window": "steady", "fresh_prompts": False, "slice_nodes": None},
    "fresh": {"window": "after_fill", "fresh_prompts": True, "slice_nodes": None},
    "s16": {"window": "steady", "fresh_prompts": True, "slice_nodes": None},
    "s19": {"window": "steady", "fresh_prompts": True},
}
"""Twin variants compared: session 15's (intervals after the fill of a 2-depth replay,
i.e. its drain; prompts repeated each cycle), each session-16 change alone, both, and
both on a slice of a large fleet (session 19's default; the same as ``s16`` at 48)."""
INTERVAL = system("libra").planner_config.plan_interval_steps


def _ends(raw: dict[str, Any]) -> list[float]:
    return [r["start_s"] + r["train_s"] for r in raw["train_log"]]


def _fed(spec: ClusterSpec, twin_kwargs: dict[str, Any], sim: Simulator | None, trace: list,
         k: int, ends: list[float]) -> TwinRefiner:
    """A twin as the run had it at decision ``k`` (0: the preflight's startup profile)."""
    twin = TwinRefiner(spec, system("libra"), **twin_kwargs)
    if k == 0:
        step0 = [t for t in trace if t.step == 0][:STARTUP_PROFILE_SIZE]
        twin.observe_step(step0, provisional=True)
        return twin
    assert sim is not None
    now = ends[k - 1]
    for step in sim.steps:
        if any(t.finished_s < 0 or t.finished_s > now for t in sim.by_step[step]):
            break
        twin.observe_step([t.rec for t in sim.by_step[step]])
    twin.observe_release(max(s for s, at in sim.release_s.items() if at <= now))
    return twin


def _history(sim: Simulator | None, trace: list, k: int) -> list[RequestStats]:
    if k == 0:
        recs = [t for t in trace if t.step == 0][:STARTUP_PROFILE_SIZE]
    else:
        assert sim is not None
        recs = [t.rec for b in list(sim.consumed.values())[:k] for t in b]
    return [RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s) for t in recs]


def measure(workload: str, seed: int, decisions: list[int], twins: dict[str, dict[str, Any]],
            gpus: int = 48, num_steps: int = 20) -> list[dict[str, Any]]:
    """One row per (decision, candidate) with each variant's twin and the simulation."""
    scale = SCALES[gpus]
    spec = cluster(scale["cluster"])
    trace = generate(workload_config(workload, num_steps=num_steps,
                                     prompts_per_step=scale["prompts_per_step"], seed=seed))
    libra = system("libra")
    libra = libra.fitting(spec.hardware, spec.model, max(t.total_tokens for t in trace))
    static = replace(libra, enable_replan=False, enable_elastic=False)
    depth = pipeline_depth(libra.staleness)
    plan0 = initial_plan(spec, trace, libra)[0]
    sim = Simulator(spec, trace, static, plan0, None)
    ends0 = _ends(sim.run())
    simulated: dict[tuple, list[float]] = {}
    rows = []
    for k in decisions:
        history = _history(sim, trace, k)
        first = next(iter(twins.values()))
        search = PlanSearch(spec.hardware, spec.model, ClusterShape(spec.num_nodes, 8),
                            SearchSpace(node_patterns=libra.node_patterns, train_tp=8),
                            refiner=_fed(spec, first, sim, trace, k, ends0))
        work = Workload(len([t for t in trace if t.step == 0]), tuple(history), depth)
        cands = search.candidates(search.cost_model(work), work)
        fed = {w: _fed(spec, kw, sim, trace, k, ends0) for w, kw in twins.items()}
        for cand in cands:
            key = cand.plan.key()
            if key not in simulated:
                simulated[key] = _ends(Simulator(spec, trace, static, cand.plan, None).run())
            e = simulated[key]
            sim_s = (steady_step_s([{"start_s": x, "train_s": 0.0} for x in e], depth)
                     if k == 0 else (e[k - 1 + INTERVAL] - e[k - 1]) / INTERVAL)
            rows.append({
                "workload": workload, "seed": seed, "decision_step": k,
                "train_gpus": cand.plan.train_gpus,
                "rollout_tps": cand.plan.to_dict()["rollout_tps"],
                "in_force": key == plan0.key(),
                **{f"{w}_s": max(cand.train_s, t.rollout_s(cand.plan, work))
                   for w, t in fed.items()},
                "simulated_s": sim_s,
            })
    return rows


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for m in range(i, j + 1):
                out[order[m]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    den = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return num / den if den else 0.0


def summary(rows: list[dict[str, Any]], window: str) -> dict[str, Any]:
    """Agreement, per-split bias and noise, rank correlation and pick regret."""
    ok = [r for r in rows if math.isfinite(r[f"{window}_s"])]
    ratios = [r[f"{window}_s"] / r["simulated_s"] for r in ok]
    splits: dict[int, list[float]] = {}
    for r, x in zip(ok, ratios, strict=True):
        splits.setdefault(r["train_gpus"], []).append(math.log(x))
    decisions: dict[tuple, list[dict[str, Any]]] = {}
    for r in ok:
        decisions.setdefault((r["workload"], r["seed"], r["decision_step"]), []).append(r)
    rhos, regrets = [], []
    for cands in decisions.values():
        if len(cands) < 3:
            continue
        rhos.append(spearman([c[f"{window}_s"] for c in cands], [c["simulated_s"] for c in cands]))
        pick = min(cands, key=lambda c: c[f"{window}_s"])
        regrets.append(pick["simulated_s"] / min(c["simulated_s"] for c in cands))
    return {
        "window": window,
        "within_15": sum(1 for x in ratios if abs(x - 1) <= 0.15),
        "candidates": len(ratios),
        "median_ratio": statistics.median(ratios),
        "per_split": {
            g: {"bias": math.exp(statistics.median(v)),
                "noise": statistics.pstdev(v) if len(v) > 1 else 0.0, "n": len(v)}
            for g, v in sorted(splits.items())
        },
        "spearman_mean": statistics.mean(rhos) if rhos else None,
        "regret_mean": statistics.mean(regrets) if regrets else None,
        "picks_best": sum(1 for r in regrets if r == 1.0),
        "decisions": len(regrets),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated trace seeds")
    parser.add_argument("--workloads", default="r2e,r2e-drift,math-drift",
                        help="comma-separated workloads (shapes or drift variants)")
    parser.add_argument("--decisions", default="0,5,10",
                        help="decision steps; 0 is the preflight")
    parser.add_argument("--twins", default=",".join(TWINS),
                        help=f"twin variants to compare, of {', '.join(TWINS)}")
    parser.add_argument("--gpus", type=int, choices=sorted(SCALES), default=48,
                        help="cluster scale (its preset and prompts per step)")
    parser.add_argument("--steps", type=int, default=20, help="trace steps (default 20)")
    parser.add_argument("--slice-nodes", default="",
                        help="comma-separated slice sizes in nodes, each an s19 variant")
    parser.add_argument("--json", action="store_true", help="print rows and summaries as JSON")
    args = parser.parse_args()
    twins = _variants(parser, args.twins, args.slice_nodes)
    decisions = [int(k) for k in args.decisions.split(",")]
    need = min_steps(decisions)
    if args.steps < need:
        parser.error(f"--steps: decisions {args.decisions} need at least {need} steps, "
                     f"got {args.steps}")
    started = time.process_time()
    rows = [r for w in args.workloads.split(",") for s in args.seeds.split(",")
            for r in measure(w, int(s), decisions, twins, args.gpus, args.steps)]
    out = {w: summary(rows, w) for w in twins}
    if args.json:
        print(json.dumps({"rows": rows, "summary": out}, indent=1))
        return
    for w, s in out.items():
        print(f"twin {w}: within +-15% {s['within_15']}/{s['candidates']}, median twin/sim "
              f"{s['median_ratio']:.2f}; Spearman mean {s['spearman_mean']:.2f}; pick regret "
              f"mean {s['regret_mean']:.3f}, best picked {s['picks_best']}/{s['decisions']}")
        for g, v in s["per_split"].items():
            print(f"   train {g:3d} GPUs: bias {v['bias']:.2f}, noise {v['noise']:.2f} "
                  f"(n {v['n']})")
    print(f"CPU {time.process_time() - started:.0f} s, load {os.getloadavg()[0]:.1f}")


def min_steps(decisions: list[int]) -> int:
    """Trace steps the decisions need: a later decision K reads steps K .. K + 4; the
    preflight's reference, a steady window between a fill and a drain of a pipeline
    depth each (a bounded run can train one batch fewer than it has steps)."""
    depth = pipeline_depth(system("libra").staleness)
    later = max((k + INTERVAL + 1 for k in decisions if k > 0), default=0)
    return max(later, 2 * depth + 2 if 0 in decisions else 0)


def _variants(parser: argparse.ArgumentParser, names: str, slice_nodes: str
              ) -> dict[str, dict[str, Any]]:
    """The twin variants ``--twins`` and ``--slice-nodes`` name (bad ones exit 2)."""
    out = {}
    for name in names.split(","):
        if name not in TWINS:
            parser.error(f"--twins: unknown variant {name!r}; valid: {', '.join(TWINS)}")
        out[name] = TWINS[name]
    for text in filter(None, slice_nodes.split(",")):
        if not text.isdigit() or int(text) < 1:
            parser.error(f"--slice-nodes: {text!r} is not a node count >= 1")
        out[f"slice{text}"] = {**TWINS["s19"], "slice_nodes": int(text)}
    return out


if __name__ == "__main__":
    main()
