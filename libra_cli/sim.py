"""``libra sim`` and ``libra bench paper``: the cluster simulator from the command line.

Examples:
  libra sim --trace r2e.jsonl --cluster a800x48 --system libra --json
  libra sim --generate r2e --cluster h100x1000 --system sync-lb
  libra sim trace --shape search --steps 20 --out search.jsonl     write a generated trace
  libra bench paper --gpus 48 --seeds 3 --json
  libra sim validate --json     real CPU demo run vs its replay (predicted/measured rollout time)

``libra sim`` prints one JSON object (throughput_traj_per_s, tokens_per_s, makespan_s,
lower_bound_s, p99_traj_latency_s, gpu_busy_fraction, migrations, planner_moves, ...);
an infeasible workload prints ``{"feasible": false, "reason": ...}`` and exits 1; a bad
trace line, preset or system name exits 2 with the line number / field in the message.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from libra.errors import InvalidArgument


def cmd_sim(args: argparse.Namespace) -> int:
    from sim import generators, presets, run, systems, trace

    try:
        spec = presets.cluster(args.cluster, args.model)
        sysconf = systems.system(args.system)
        if args.trace:
            workload = trace.load(args.trace)
        else:
            workload = generators.generate(
                generators.workload_config(
                    args.generate,
                    num_steps=args.steps,
                    prompts_per_step=args.prompts,
                    seed=args.seed,
                )
            )
    except (ValueError, OSError) as exc:
        print(f"libra sim: {exc}", file=sys.stderr)
        return 2
    result = run.run(spec, workload, sysconf, twin_workers=args.twin_workers,
                     twin_slice_nodes=args.twin_slice_nodes)
    print(json.dumps(result, indent=2 if args.json else None, default=str))
    return 0 if result.get("feasible") else 1


def cmd_trace(args: argparse.Namespace) -> int:
    from sim import generators, trace

    try:
        workload = generators.generate(
            generators.workload_config(
                args.shape, num_steps=args.steps, prompts_per_step=args.prompts, seed=args.seed
            )
        )
    except ValueError as exc:
        print(f"libra sim trace: {exc}", file=sys.stderr)
        return 2
    trace.dump(workload, args.out)
    print(json.dumps({"path": str(args.out), "trajectories": len(workload)}))
    return 0


def cmd_paper(args: argparse.Namespace) -> int:
    from sim import paper

    try:
        result = paper.run_paper(
            args.gpus, args.seeds, oracle=args.oracle, held_out=args.held_out, jobs=args.jobs
        )
    except (ValueError, InvalidArgument) as exc:
        print(f"libra bench paper: {exc}", file=sys.stderr)
        return 2
    png = paper.chart(result, Path(args.out_dir) / f"paper_{args.gpus}.png")
    out = Path(args.out_dir) / f"paper_{args.gpus}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    if args.json:
        print(
            json.dumps(
                {
                    "summary": result["summary"],
                    "seed_list": result["seed_list"],
                    "oracle_choices": result["oracle_choices"],
                    "wall_s": result["wall_s"],
                    "chart": str(png) if png else None,
                    "results": str(out),
                },
                indent=2,
            )
        )
    else:
        print(paper.table(result))
        print(f"chart: {png}\nresults: {out}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    import tempfile

    from libra_cli.launcher import ROOT
    from libra_cli.sim_validation import validate

    run_root = args.validate_root or Path(tempfile.mkdtemp(prefix="libra-sim-validate-"))
    run_root.mkdir(parents=True, exist_ok=True)
    result = validate(run_root, ROOT, num_steps=args.steps)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(
            f"rollout time (mean admission->finish over {result['num_trajectories']} "
            f"trajectories): predicted {result['predicted_rollout_s'] * 1000:.1f} ms, measured "
            f"{result['measured_rollout_s'] * 1000:.1f} ms, ratio {result['ratio']:.2f} "
            f"(tolerance +-{result['tolerance']:.0%})"
        )
    return 0 if result["within_tolerance"] else 1


def _positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _slice_nodes(text: str) -> int | None:
    """An argparse type: ``none`` or an integer >= 1 (the twin's slice, in nodes)."""
    return None if text.lower() == "none" else _positive_int(text)


def register(sub: Any) -> None:
    """Add ``sim`` and ``bench`` to the ``libra`` sub-command parser."""
    p = sub.add_parser(
        "sim",
        help="simulate a cluster running a workload trace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=cmd_sim)
    p.add_argument("--json", action="store_true", help="indented JSON")
    p.add_argument("--trace", type=Path, help="trace JSONL file (docs/simulator.md)")
    p.add_argument(
        "--generate",
        default="r2e",
        help="workload to generate when no --trace: r2e|search|math or a drift variant "
        "r2e-drift|search-drift|math-drift (lengths grow 2-3x over the run)",
    )
    p.add_argument("--steps", type=int, default=20,
                   help="RL steps of the generated workload (default 20)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (x4 samples)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the generated workload (default 0)")
    p.add_argument(
        "--cluster", default="a800x48", help="preset HWxCOUNT (a800x48, h100x1000) or JSON file"
    )
    p.add_argument(
        "--model", default=None, help="model preset (qwen3-4b, qwen3-14b, qwen3-30b-a3b)"
    )
    from sim.systems import SYSTEM_NAMES

    p.add_argument("--system", default="libra", help="compared system: " + "|".join(SYSTEM_NAMES))
    p.add_argument(
        "--twin-workers", type=_positive_int, default=1,
        help="processes the planner's twin scores a decision's candidate plans on "
        "(default 1; the result is the same, a decision takes about its slowest run)",
    )
    from sim.twin_slice import TWIN_SLICE_NODES

    p.add_argument(
        "--twin-slice-nodes", type=_slice_nodes, default=TWIN_SLICE_NODES,
        help="the twin simulates a cluster of k times this many nodes as a 1/k slice "
        f"(default {TWIN_SLICE_NODES}: 1,000 GPUs in fifths, 48 GPUs whole; "
        "'none': always the whole fleet, slower at scale)",
    )
    tsub = p.add_subparsers(dest="sim_command")
    t = tsub.add_parser("trace", help="write a generated trace as JSONL")
    t.add_argument("--shape", default="r2e", help="r2e|search|math or a *-drift variant")
    t.add_argument("--steps", type=int, default=20, help="RL steps to generate (default 20)")
    t.add_argument("--prompts", type=int, default=16,
                   help="prompts per step, x4 samples each (default 16)")
    t.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    t.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    t.set_defaults(func=cmd_trace)
    v = tsub.add_parser(
        "validate", help="run the CPU demo for real, replay it, compare rollout times"
    )
    # Its own dest: a sub-parser default for ``run_root`` would replace the global one.
    v.add_argument("--run-root", dest="validate_root", type=Path, default=None,
                   help="stack run root (default: temp)")
    v.add_argument("--steps", type=int, default=12, help="RL steps of the demo job")
    v.add_argument("--json", action="store_true",
                   help="print the whole comparison as JSON (default: one line)")
    v.set_defaults(func=cmd_validate)

    b = sub.add_parser("bench", help="benchmarks").add_subparsers(
        dest="bench_command", required=True
    )
    pp = b.add_parser("paper", help="every system on the three workloads (simulated)")
    pp.add_argument(
        "--gpus", type=int, default=48, choices=(48, 1000),
        help="cluster preset: 48 = a800x48 (6 nodes x 8 A800-80G; 16 prompts/step, 20 "
        "steps), 1000 = h100x1000 (125 nodes x 8 H100-80G; 320 prompts/step, 8 steps); "
        "Qwen3-14B on both (default 48)",
    )
    pp.add_argument("--seeds", type=int, default=3, help="number of trace seeds per workload")
    pp.add_argument(
        "--oracle",
        action="store_true",
        help="also run each static peer at its own best split and layout, swept on seed 0 "
        "(an oracle no real user has; ~5 min at 48 GPUs)",
    )
    pp.add_argument(
        "--held-out",
        action="store_true",
        help="run seeds 10, 11, ... (never used for tuning) instead of 0, 1, ..., and the "
        "drift variants (r2e-drift, search-drift, math-drift) beside the three shapes",
    )
    pp.add_argument(
        "--jobs", type=int, default=2,
        help="processes running the (workload, seed) cells (default 2; results identical)",
    )
    pp.add_argument("--out-dir", default="runs/bench", help="where the PNG and JSON go")
    pp.add_argument("--json", action="store_true",
                    help="print the summary and the files written as JSON instead of "
                    "the table")
    pp.set_defaults(func=cmd_paper)
