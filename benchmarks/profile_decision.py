"""Where a planner decision's time goes at 48 GPUs (issue 20, session 16).

One ``PlanSearch.search`` per (workload, seed) after 5 observed steps, as
``bench_sim_speed.py`` times it, under a sampling profiler (SIGPROF every 0.5 CPU-ms:
cProfile's per-call hook inflated the small policy functions several-fold). Reports:

- per decision: CPU, and per refined candidate its twin run's CPU, events and score;
- each run split at the fill's end (the measured window opens when the fill's last
  training step ends): the events before and after it, and the share of all events a
  branch and bound could skip at best, i.e. with the pick refined first and every other
  run stopped once its window has lasted the pick's score x window (the score is a
  difference of two training ends, so nothing before the window can be cut);
- sampled CPU by component (the innermost frame of a known module) and the cyclic
  garbage collector's CPU (``gc.callbacks``).

    PYTHONPATH=. .venv/bin/python benchmarks/profile_decision.py \\
        [--shapes r2e,r2e-drift] [--seeds 0,1,2] [--json]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import signal
import time
from types import FrameType
from typing import Any

SAMPLE_S = 0.0005
COMPONENTS = (
    ("/scheduling/policy/", "policy core (C-MLFQ, prefix tree, routing, store)"),
    ("/sim/instance.py", "instance segments (batch timing)"),
    ("/scheduling/planner/roofline.py", "instance segments (batch timing)"),
    ("/sim/trainer.py", "RL loop (batches, training)"),
    ("/sim/rl_loop.py", "RL loop (batches, training)"),
    ("/sim/weight_sync.py", "RL loop (batches, training)"),
    ("/sim/engine.py", "event loop"),
    ("/sim/state.py", "event loop"),
    ("/sim/twin.py", "twin setup (trace)"),
)


class _Sampler:
    """CPU samples by component; the collector's CPU by callback."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.gc_s = 0.0
        self._gc_start = 0.0

    def on_sample(self, _sig: int, frame: FrameType | None) -> None:
        while frame is not None:
            name = frame.f_code.co_filename
            for marker, component in COMPONENTS:
                if marker in name:
                    self.counts[component] += 1
                    return
            frame = frame.f_back
        self.counts["other"] += 1

    def on_gc(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._gc_start = time.process_time()
        else:
            self.gc_s += time.process_time() - self._gc_start


def _recording_simulator() -> type:
    """``sim.engine.Simulator`` that keeps the clock of every event it queues."""
    from sim.engine import Simulator

    class Recording(Simulator):  # type: ignore[misc]
        runs: list[dict[str, Any]] = []
        """Per run: its plan, training log and event clocks (not the run itself: keeping
        whole runs alive would load the garbage collector measured here)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.push_clock_s: list[float] = []
            super().__init__(*args, **kwargs)
            Recording.runs.append({"plan": self.plan.key(), "log": self.trainer.log,
                                   "clocks": self.push_clock_s})

        def _push(self, when: float, kind: int, payload: Any) -> None:
            self.push_clock_s.append(self.clock.t)
            super()._push(when, kind, payload)

    return Recording


def _decision(shape: str, seed: int, recording: type, sampler: _Sampler) -> dict[str, Any]:
    from benchmarks.bench_sim_speed import decision_setup
    from sim.generators import workload_config
    from sim.twin import TWIN_STEPS_PER_DEPTH

    search, work, _twin = decision_setup(workload_config(
        shape, num_steps=20, prompts_per_step=16, seed=seed))
    depth = work.pipeline_depth
    measured = max(1, round((TWIN_STEPS_PER_DEPTH - 1) * depth))
    recording.runs.clear()
    gc.collect()  # the collector's share is the decision's own, not the set-up's garbage
    gc_before = sampler.gc_s
    cpu = time.process_time()
    best = search.search(work)
    cpu_s = time.process_time() - cpu
    runs = []
    for run in recording.runs:
        log = run["log"]
        first_end_s = log[depth - 1]["start_s"] + log[depth - 1]["train_s"]
        last = log[depth - 1 + measured]
        score_s = (last["start_s"] + last["train_s"] - first_end_s) / measured
        cut_at_s = first_end_s + best.objective_s * measured
        clocks = run["clocks"]
        runs.append({
            "plan": str(run["plan"]), "score_s": score_s, "events": len(clocks),
            "fill_events": sum(c <= first_end_s for c in clocks),
            "events_after_cut": sum(c > cut_at_s for c in clocks) if score_s > best.rollout_s
            else 0,
        })
    return {"shape": shape, "seed": seed, "cpu_s": cpu_s, "gc_s": sampler.gc_s - gc_before,
            "picked": str(best.plan.key()), "picked_objective_s": best.objective_s,
            "picked_rollout_s": best.rollout_s,
            "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="r2e,r2e-drift",
                        help="workloads (default r2e,r2e-drift)")
    parser.add_argument("--seeds", default="0,1,2", help="workload seeds (default 0,1,2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    from sim.generators import DRIFT_VARIANTS, SHAPES

    shapes, known = args.shapes.split(","), (*SHAPES, *DRIFT_VARIANTS)
    if not set(shapes) <= set(known):
        parser.error(f"--shapes: each must be one of {', '.join(known)}, got {args.shapes!r}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    import sim.twin

    recording = _recording_simulator()
    sim.twin.Simulator = recording  # the twin builds its runs from this name
    sampler = _Sampler()
    signal.signal(signal.SIGPROF, sampler.on_sample)
    gc.callbacks.append(sampler.on_gc)
    signal.setitimer(signal.ITIMER_PROF, SAMPLE_S, SAMPLE_S)
    decisions = [_decision(shape, seed, recording, sampler) for shape in shapes for seed in seeds]
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    events = sum(r["events"] for d in decisions for r in d["runs"])
    total = sum(sampler.counts.values())
    out = {
        "decisions": decisions,
        "cpu_s": sum(d["cpu_s"] for d in decisions),
        "gc_share": sum(d["gc_s"] for d in decisions) / sum(d["cpu_s"] for d in decisions),
        "fill_event_share": sum(r["fill_events"] for d in decisions for r in d["runs"]) / events,
        "cuttable_event_share": sum(r["events_after_cut"] for d in decisions
                                    for r in d["runs"]) / events,
        "components": {k: v / total for k, v in sampler.counts.most_common()},
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        _print(out)


def _print(out: dict[str, Any]) -> None:
    for d in out["decisions"]:
        print(f"{d['shape']} seed {d['seed']}: {d['cpu_s']:.3f} CPU-s, {len(d['runs'])} twin "
              f"runs, pick {d['picked']} ({d['picked_objective_s']:.1f} s)")
        for r in d["runs"]:
            print(f"    {r['plan']}: score {r['score_s']:.1f} s, {r['events']} events "
                  f"({r['fill_events']} in the fill, {r['events_after_cut']} after a cut)")
    print(f"events in the fill {out['fill_event_share']:.0%}; a branch and bound with the "
          f"pick first skips at most {out['cuttable_event_share']:.1%}; GC "
          f"{out['gc_share']:.1%} of decision CPU")
    for name, share in out["components"].items():
        print(f"  {share:6.1%}  {name}")


if __name__ == "__main__":
    main()
