"""What a planner move costs under each reconfigure strategy (issue 20, session 16).

A static libra-like run (C-MLFQ, bounded consumption, 24:24, uniform TP8) is moved,
after training step ``--at-step``, to every rollout node re-laid as TP4 x 2. Each
strategy of ``sim.moves`` runs the same move; so does an *ideal* counterfactual (no
weight load, turns resumed with their tokens and no re-prefill), which no real system
can do. A strategy's cost is its makespan minus the ideal's. Beside it, the planner's
predicted costs at the move (``migrated``: weight load + re-prefill; ``recreated``:
the step time x the share re-created). Strategies alternate within each seed.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_moves.py [--seeds 0,1,2] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from scheduling.planner import Plan, RequestStats, Workload, pipeline_depth
from scheduling.planner.move_cost import migrated_move_cost
from sim import moves, replan, rl_loop
from sim.engine import Simulator
from sim.paper import SCALES, _trace
from sim.presets import WEIGHT_LOAD_BW_BYTES_PER_S, cluster
from sim.run import static_plan
from sim.systems import system

IDEAL = "ideal"


class _IdealSimulator(Simulator):
    """A move's handed-back turns keep their prefix cache (no re-prefill)."""

    def teardown_node(self, node: int, now: float) -> list[Any]:
        handed = super().teardown_node(node, now)
        if self.transition is not None:
            for t in handed:
                t.needs_full_prefill = False
        return handed


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def one(shape: str, seed: int, strategy: str, at_step: int) -> dict[str, Any]:
    """Run the forced move once; return its makespan, move record and predictions."""
    spec, scale = cluster("a800x48"), SCALES[48]
    trace = _trace(scale, shape, seed)
    conf = replace(
        system("libra"), enable_replan=False, enable_elastic=False, planner_twin=False,
        train_gpus=24, node_patterns=((8,), (4, 4)),
        reconfigure_strategy="migrate" if strategy == IDEAL else strategy,
    )
    plan = static_plan(spec, conf)
    target = Plan(plan.train, ((4, 4),) * len(plan.rollout_nodes))
    cls = _IdealSimulator if strategy == IDEAL else Simulator
    sim = cls(spec, trace, conf, plan)
    predicted: dict[str, float] = {}
    on_train_done = rl_loop.on_train_done

    def hook(s: Simulator, step: int, now: float) -> None:
        on_train_done(s, step, now)
        if s.version != at_step:
            return
        done = [t.rec for t in s.trajs if t.finished_s >= 0]
        work = Workload(
            len(s.by_step[s.steps[0]]),
            tuple(RequestStats(r.prompt_tokens, r.post_prompt_tokens, r.tool_s) for r in done),
            pipeline_depth(conf.staleness),
        )
        pinned = sum(load.active_trajectories for load in s.load_list)
        ends = [r["start_s"] + r["train_s"] for r in s.trainer.log]
        cost = migrated_move_cost(plan, target, work, spec.hardware, spec.model,
                                  spec.gpus_per_node, WEIGHT_LOAD_BW_BYTES_PER_S, pinned)
        predicted.update(
            migrated_s=cost.total_s, load_s=cost.load_s, reprefill_s=cost.reprefill_s,
            recreated_s=(ends[-1] - ends[-6]) / 5 * plan.rollout_share_recreated(target, 8),
            in_flight=pinned,
        )
        replan.apply_plan(s, target, now)

    load_bw = 1e30 if strategy == IDEAL else WEIGHT_LOAD_BW_BYTES_PER_S
    with _patched(rl_loop, "on_train_done", hook), \
            _patched(replan, "WEIGHT_LOAD_BW_BYTES_PER_S", load_bw):
        raw = sim.run()
    (record,) = raw["move_log"]
    return {
        "shape": shape, "seed": seed, "strategy": strategy, "makespan_s": raw["makespan_s"],
        "predicted": predicted,
        "move": {k: v for k, v in record.items() if k != "ops"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--shapes", default="r2e,r2e-drift")
    parser.add_argument("--at-step", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started, cpu0 = time.perf_counter(), time.process_time()
    arms = [IDEAL, *moves.RECONFIGURE_STRATEGIES]
    rows = [
        one(shape, int(seed), arm, args.at_step)
        for shape in args.shapes.split(",") for seed in args.seeds.split(",") for arm in arms
    ]
    ideal = {(r["shape"], r["seed"]): r["makespan_s"] for r in rows if r["strategy"] == IDEAL}
    for r in rows:
        r["cost_over_ideal_s"] = r["makespan_s"] - ideal[(r["shape"], r["seed"])]
    summary = {
        arm: statistics.mean(r["cost_over_ideal_s"] for r in rows if r["strategy"] == arm)
        for arm in arms if arm != IDEAL
    }
    preds = [r["predicted"] for r in rows if r["strategy"] == IDEAL]
    out = {
        "rows": rows, "mean_cost_over_ideal_s": summary,
        "mean_predicted_migrated_s": statistics.mean(p["migrated_s"] for p in preds),
        "mean_predicted_recreated_s": statistics.mean(p["recreated_s"] for p in preds),
        "wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0,
        "load_avg": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for arm, cost in summary.items():
        per = [round(r["cost_over_ideal_s"]) for r in rows if r["strategy"] == arm]
        print(f"{arm:16s} mean cost over ideal {cost:7.1f} s  {per}")
    print(f"predicted: migrated {out['mean_predicted_migrated_s']:.1f} s, "
          f"recreated {out['mean_predicted_recreated_s']:.1f} s")
    print(f"wall {out['wall_s']:.0f} s, cpu {out['cpu_s']:.0f} s, load {out['load_avg']}")


if __name__ == "__main__":
    main()
