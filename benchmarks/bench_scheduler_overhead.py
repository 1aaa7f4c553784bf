"""How much the scheduler service costs a real run, measured side by side in one run.

Starts the stack (`libra up`), runs a demo-shaped job, and reads each service's CPU time
from /proc before and after. Prints the scheduler's share of all CPU the stack used, its
CPU per trajectory, and the job's wall time. The scheduler competes with rollout and
training for the same two cores, so its CPU share is the wall time it adds at most.

Usage: python benchmarks/bench_scheduler_overhead.py [--steps N] [--policy cmlfq] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import tomllib
from pathlib import Path

from libra.cli import stack
from libra.clients.coordinator import GrpcCoordinatorClient

ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def job_spec(steps: int, policy: str) -> str:
    spec = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec["algorithm"].update({"num_steps": steps, "sft_steps": 200})
    spec["layout"]["policy"] = policy
    return json.dumps(spec)


async def run_job(address: str, spec: str) -> tuple[float, int]:
    client = GrpcCoordinatorClient(address)
    job = await client.create_job(spec, "json")
    started = time.perf_counter()
    while True:
        job, steps, counters = await client.get_job(job.job_id)
        if job.state.is_terminal:
            break
        await asyncio.sleep(0.5)
    await client.close()
    produced = counters.get("produced", 0) + counters.get("failed", 0)
    return time.perf_counter() - started, produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--policy", default="cmlfq")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    run_root = Path(tempfile.mkdtemp(prefix="libra-bench-"))
    state = stack.up(run_root)
    try:
        pids = {s["name"]: s["pid"] for s in state["services"]}
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        wall_s, produced = asyncio.run(run_job(stack.coordinator_address(state),
                                               job_spec(args.steps, args.policy)))
        used = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
    finally:
        stack.down(run_root)
    total = sum(used.values())
    result = {
        "policy": args.policy, "steps": args.steps, "job_wall_s": round(wall_s, 2),
        "trajectories": produced, "cpu_s": {k: round(v, 2) for k, v in used.items()},
        "scheduler_cpu_share": round(used["scheduler"] / total, 4),
        "scheduler_cpu_ms_per_trajectory": round(1000 * used["scheduler"] / max(produced, 1), 3),
        "scheduler_cpu_over_wall": round(used["scheduler"] / wall_s, 4),
    }
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
