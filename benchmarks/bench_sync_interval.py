"""How the ranking changes when each system syncs weights as its counterpart does
(issue 20 item 2): every system at the reference split on held-out seeds, (a) with its
counterpart's ``sync_interval`` / drain (``sim.systems``), (b) every system syncing each
step without a drain (the simulator before). Same traces, arms alternated per seed.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_sync_interval.py [--seeds 10,11,12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from typing import Any

from sim.generators import DRIFT_VARIANTS, SHAPES
from sim.paper import SCALES, _trace
from sim.presets import cluster
from sim.run import run
from sim.systems import SYSTEM_NAMES, reference_train_gpus, system


def arms(name: str) -> dict[str, Any]:
    """The system as its counterpart syncs, and syncing every step without a drain."""
    conf = system(name)
    if conf.mode == "async" and not conf.enable_replan:
        conf = conf.with_split(reference_train_gpus(6, 8), conf.node_patterns[0], "reference")
    return {"default": conf, "every_step": replace(conf, sync_interval=1, drain_before_sync=False)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="10,11,12")
    parser.add_argument("--shapes", default=",".join(SHAPES + tuple(DRIFT_VARIANTS)))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec, scale = cluster("a800x48"), SCALES[48]
    rows: dict[str, dict[str, dict[str, list[float]]]] = {}
    cpu0, load0 = time.process_time(), os.getloadavg()[0]
    for shape in args.shapes.split(","):
        for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
            trace = _trace(scale, shape, seed)
            variants = ("default", "every_step")[:: 1 if i % 2 == 0 else -1]  # alternate
            for name in SYSTEM_NAMES:
                for variant in variants:
                    r = run(spec, trace, arms(name)[variant])
                    cell = rows.setdefault(shape, {}).setdefault(name, {})
                    cell.setdefault(variant, []).append(r["throughput_traj_per_s"])
                    cell.setdefault(variant + "_stale", []).append(r["max_consumed_staleness"])
    out = {"rows": rows, "cpu_s": time.process_time() - cpu0, "load": [load0, os.getloadavg()[0]]}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for shape, by_name in rows.items():
        for variant in ("default", "every_step"):
            ranked = sorted(by_name, key=lambda n: -statistics.mean(by_name[n][variant]))
            print(f"{shape:12} {variant:10} " + "  ".join(
                f"{n} {statistics.mean(by_name[n][variant]):.3f}"
                f"(st {max(by_name[n][variant + '_stale'])})" for n in ranked))
    print(f"cpu {out['cpu_s']:.0f} s, load {out['load'][0]:.1f} -> {out['load'][1]:.1f}")


if __name__ == "__main__":
    main()
