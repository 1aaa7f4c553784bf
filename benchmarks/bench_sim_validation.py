"""Issue 6 item 5: predicted vs measured rollout time of a real CPU demo run.

Starts a stack in a temporary run root, runs the demo job (12 RL steps after a short SFT
warm-up, ~1 minute on 2 cores), reads the instances' in-run engine calls and loop
profiles (pass phases, task start lags, tool and scoring RPCs as the rollout saw them),
replays the recorded trace and prints predicted, measured and
their ratio (procedure and definitions: libra_cli/sim_validation.py, docs/simulator.md).

    python benchmarks/bench_sim_validation.py [--steps 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from libra_cli.sim_validation import validate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sim-validation-") as tmp:
        result = validate(Path(tmp), ROOT, num_steps=args.steps)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(f"trajectories {result['num_trajectories']}")
        print(f"predicted rollout time  {result['predicted_rollout_s'] * 1000:8.1f} ms")
        print(f"measured rollout time   {result['measured_rollout_s'] * 1000:8.1f} ms")
        print(f"ratio                   {result['ratio']:8.2f}  (tolerance +-20%)")
        inputs = result["measured_inputs"]
        for iid, loop in inputs["loop_costs"].items():
            print(f"{iid}: " + "  ".join(f"{k} {v * 1000:.2f} ms" for k, v in loop.items()
                                        if k.endswith("_s")) + "  (in-run loop costs)")
        print(f"rpc latency sources     {inputs['rpc_latency_sources']}")
        for name, value in inputs["measured_gaps"].items():
            print(f"{name:<24}{value * 1000:8.1f} ms  (diagnostic)")
    return 0 if result["within_tolerance"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
