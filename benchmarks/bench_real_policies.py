"""Real-service check (issue 20 item 7): the demo job on the real stack under each policy.

Each registered placement policy (``scheduling/policy/registry.py`` is the list) runs
the demo job (``deploy/configs/demo.toml``, shortened by ``--steps``) through
``libra run --json``: Redis, coordinator, scheduler, two rollout instances, trainer and
tool gateway, each its own process. Seeds x policies, the arms alternated: seed ``i``
starts at policy ``i mod P`` (ABC, BCA, CAB), so a drift in the machine's load does not
fall on one arm. Per run: trajectories/s (the report's trained trajectories over the
RL steps' wall time), time to the target reward (RL wall seconds until the mean reward
of ``--window`` consecutive steps first reaches ``--target``; the supervised warm
start, identical across arms, is not counted) and ``/proc/loadavg`` before and after.

No target: the figures go in docs/simulator.md. On a shared CPU host the times carry
the load; the table prints each run's load so a reader can weigh them.

    python -m benchmarks.bench_real_policies [--seeds 3] [--steps 20] [--target 0.5]
        [--policies cmlfq,least_loaded] [--set algorithm.sft_steps=600] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scheduling.policy.registry import POLICY_NAMES

ROOT = Path(__file__).resolve().parents[1]
DEMO_SPEC = ROOT / "deploy" / "configs" / "demo.toml"


def alternated(policies: list[str], seeds: list[int]) -> list[tuple[int, str]]:
    """(seed, policy) in run order: each seed rotates the policy order by one."""
    order = []
    for i, seed in enumerate(seeds):
        k = i % len(policies)
        order += [(seed, p) for p in policies[k:] + policies[:k]]
    return order


def time_to_target_s(steps: list[dict[str, Any]], target: float, window: int) -> float | None:
    """RL wall seconds until the mean reward of ``window`` consecutive steps first
    reaches ``target`` (the end of that window); ``None`` if it never does."""
    if window < 1:
        raise ValueError(f"--window must be >= 1, got {window}")
    elapsed, rewards = 0.0, []
    for s in steps:
        elapsed += float(s.get("wall_s") or 0.0)
        rewards.append(float(s["reward_mean"]))
        if len(rewards) >= window and sum(rewards[-window:]) / window >= target:
            return elapsed
    return None


def loadavg() -> str:
    """The first three fields of /proc/loadavg ('' where there is none)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


def run_one(spec: Path, policy: str, seed: int, steps: int, overrides: list[str],
            target: float, window: int) -> dict[str, Any]:
    """One ``libra run`` of the demo under ``policy`` and ``seed``; its figures."""
    sets = [f"algorithm.num_steps={steps}", f"algorithm.seed={seed}", f"task.seed={seed}",
            f'layout.policy="{policy}"', *overrides]
    cmd = [str(ROOT / ".venv" / "bin" / "libra"), "run", str(spec), "--json"]
    for s in sets:
        cmd += ["--set", s]
    before, started = loadavg(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    out: dict[str, Any] = {"policy": policy, "seed": seed, "loadavg_before": before,
                           "wall_s": round(time.monotonic() - started, 1)}
    out["loadavg_after"] = loadavg()
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {**out, "ok": False, "error": (proc.stderr or proc.stdout)[-2000:]}
    if proc.returncode != 0 or summary.get("state") != "succeeded":
        return {**out, "ok": False, "error": summary.get("message") or proc.stderr[-2000:]}
    report = json.loads(Path(summary["report"]).read_text())
    rl_steps = report["steps"]
    return {
        **out, "ok": True, "job_id": summary["job_id"], "steps": len(rl_steps),
        "rl_wall_s": round(sum(float(s.get("wall_s") or 0.0) for s in rl_steps), 1),
        "trajectories_per_s": report["throughput"]["trajectories_per_s"],
        "time_to_target_s": time_to_target_s(rl_steps, target, window),
        "reward_first_10pct": report["reward"]["first_10pct_mean"],
        "reward_last_10pct": report["reward"]["last_10pct_mean"],
        "dropped_stale": report["trajectories"]["dropped_stale"],
    }


def summarise(runs: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """Per policy: mean and min-max of trajectories/s and of time to target, and how
    many runs reached it."""
    out: dict[str, Any] = {}
    for p in policies:
        ok = [r for r in runs if r["policy"] == p and r.get("ok")]
        thr = [r["trajectories_per_s"] for r in ok]
        ttt = [r["time_to_target_s"] for r in ok if r["time_to_target_s"] is not None]
        out[p] = {
            "runs": len(ok),
            "failed": sum(1 for r in runs if r["policy"] == p and not r.get("ok")),
            "traj_per_s_mean": statistics.fmean(thr) if thr else None,
            "traj_per_s_range": [min(thr), max(thr)] if thr else None,
            "reached_target": len(ttt),
            "time_to_target_s_mean": statistics.fmean(ttt) if ttt else None,
            "time_to_target_s_range": [min(ttt), max(ttt)] if ttt else None,
            "reward_last_10pct_mean": statistics.fmean(r["reward_last_10pct"] for r in ok)
            if ok else None,
        }
    return out


def table(result: dict[str, Any]) -> str:
    """Plain-text summary, then one line per run."""
    a = result["args"]
    lines = [f"demo job on the real stack: {a['steps']} RL steps, seeds {a['seeds']}, "
             f"target reward {a['target']} (mean of {a['window']} steps), overrides "
             f"{a['set'] or 'none'}",
             f"{'policy':13} {'runs':>4} {'traj/s':>7} {'range':>13} {'reached':>7} "
             f"{'t->target s':>11} {'range':>13} {'reward end':>10}"]
    for p, row in result["summary"].items():
        def rng(v: list[float] | None) -> str:
            return f"{v[0]:.2f}-{v[1]:.2f}" if v else "-"
        thr = f"{row['traj_per_s_mean']:.2f}" if row["traj_per_s_mean"] is not None else "-"
        ttt = (f"{row['time_to_target_s_mean']:.1f}"
               if row["time_to_target_s_mean"] is not None else "-")
        rew = (f"{row['reward_last_10pct_mean']:.3f}"
               if row["reward_last_10pct_mean"] is not None else "-")
        lines.append(f"{p:13} {row['runs']:>4} {thr:>7} {rng(row['traj_per_s_range']):>13} "
                     f"{row['reached_target']:>7} {ttt:>11} "
                     f"{rng(row['time_to_target_s_range']):>13} {rew:>10}")
    lines.append("runs (in order): policy seed traj/s t->target load before/after")
    for r in result["runs"]:
        if not r.get("ok"):
            lines.append(f"  {r['policy']} {r['seed']} FAILED: {str(r.get('error'))[:200]}")
            continue
        lines.append(f"  {r['policy']} {r['seed']} {r['trajectories_per_s']} "
                     f"{r['time_to_target_s']} [{r['loadavg_before']}] -> "
                     f"[{r['loadavg_after']}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", type=Path, default=DEMO_SPEC, help="job spec (the demo)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    ap.add_argument("--steps", type=int, default=20, help="RL steps per run (default 20)")
    ap.add_argument("--policies", default=",".join(POLICY_NAMES),
                    help="comma-separated registered policies (default: all of them)")
    ap.add_argument("--target", type=float, default=0.5, help="target mean reward")
    ap.add_argument("--window", type=int, default=3, help="steps the target mean spans")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="extra spec override for every run (e.g. algorithm.sft_steps=600)")
    ap.add_argument("--out", type=Path, help="also write the JSON result here")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown or args.seeds < 1 or args.steps < 1 or args.window < 1:
        print(f"bench_real_policies: bad arguments (unknown policies {unknown}; seeds, "
              f"steps and window must be >= 1; registered: {', '.join(POLICY_NAMES)})",
              file=sys.stderr)
        return 2
    seeds = list(range(args.seeds))
    runs = []
    for seed, policy in alternated(policies, seeds):
        r = run_one(args.spec, policy, seed, args.steps, args.set, args.target, args.window)
        print(f"[{len(runs) + 1}] {policy} seed {seed}: "
              f"{r.get('trajectories_per_s', 'FAILED')} traj/s, t->target "
              f"{r.get('time_to_target_s')}, load {r['loadavg_before']}", file=sys.stderr)
        runs.append(r)
    result = {"args": {"steps": args.steps, "seeds": seeds, "target": args.target,
                       "window": args.window, "set": args.set, "policies": policies},
              "runs": runs, "summary": summarise(runs, policies)}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0 if all(r.get("ok") for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
