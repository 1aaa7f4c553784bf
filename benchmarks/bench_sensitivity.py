"""Sensitivity table: the ranking of all systems under the low / central / high value of
every uncertain engine constant (``sim.presets.UNCERTAIN``; issue 20 item 1).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_sensitivity.py [--seeds 1] [--json]
        [--constants engine_step_overhead,allreduce_bus_bw]

About 15 s per (constant, level) on the 2-core development machine at 48 GPUs.
"""

from __future__ import annotations

import argparse
import json
import sys

from sim.sensitivity import flips, run_sensitivity, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--constants", default=None, help="comma-separated subset")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = tuple(args.constants.split(",")) if args.constants else None
    try:
        result = run_sensitivity(seeds=args.seeds, constants=names)
    except ValueError as exc:
        print(f"bench_sensitivity: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**result, "flips": flips(result)}, indent=1))
        return 0
    print(table(result))
    changed = flips(result)
    print("ranking changes (best system or libra's place):" if changed else "no ranking changes")
    for line in changed:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
