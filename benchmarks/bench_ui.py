"""How fast the live view's data and the metrics answer during a real job.

Starts the bare-metal stack (`libra up`: Redis and the five services as processes) in a
throwaway run root, submits the demo job (shrunk prompts, many steps, so it trains for
the whole measurement), waits for its first step, then for ``--duration-s`` seconds
sends one request after another, in turn:

- ``ui_view``: ``GET /ui/api/jobs/{id}/view`` (what the page polls; token as cookie);
- ``v1_view``: ``GET /v1/jobs/{id}/view`` (the same view for API clients; bearer);
- ``metrics_coordinator``: the coordinator's ``/metrics`` (the job's series live there);
- ``metrics_all``: each other service's ``/metrics`` in turn.

Printed per target: samples, p50, p99 and max latency (ms, client side, keep-alive
connection), and the job's steps during the measurement. The budget (docs/
observability.md) is p99 < 100 ms. The job is cancelled and the stack stopped by pid at
the end, also on Ctrl-C.

Latency on a shared machine is mostly queueing for a CPU, so two figures that do not
depend on the machine's load are printed too: the load average during the run, and the
CPU time (``time.process_time``, this process) of building and encoding one view from a
synthetic history of ``--history-steps`` steps (the part of a request that grows with
the job's length).

Usage: python benchmarks/bench_ui.py [--duration-s 60] [--num-steps 400] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from libra_cli import stack  # noqa: E402
from libra_cli.stack_secrets import secrets_dir  # noqa: E402

TARGETS = ("ui_view", "v1_view", "metrics_coordinator", "metrics_all")


def job_spec(num_steps: int) -> str:
    """The demo job, shrunk per step (as the integration tests do) but long."""
    spec = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec["name"] = "bench-ui"
    spec["algorithm"].update({"num_steps": num_steps, "prompts_per_step": 2,
                              "samples_per_prompt": 2, "sft_steps": 5, "sft_batch_size": 8})
    return json.dumps(spec)


def view_cpu_ms(num_steps: int, repeats: int = 20) -> float:
    """CPU ms to build and encode the view of a job with ``num_steps`` step records."""
    from libra import types as t
    from libra.run_view import build_run_view, run_view_to_dict

    job = t.Job(job_id="bench-1", name="bench", state=t.JobState.RUNNING,
                spec_json=json.dumps({"algorithm": {"num_steps": num_steps}}),
                created_at_ms=1, updated_at_ms=1, step=num_steps)
    steps = [{"step": n, "policy_version": n, "reward_mean": 0.5, "num_trajectories": 4,
              "rollout_s": 1.0, "train_s": 0.5, "publish_s": 0.1, "wall_s": 1.7,
              "tokens_mean": 80.0, "bucket_occupancy": {"short": 3, "long": 1},
              "migrations": 1, "reward_components": {"exact_match": 0.5},
              "loss": 0.1, "grad_norm": 1.0, "recompute_s": 0.1} for n in range(num_steps)]
    start = time.process_time()
    for _ in range(repeats):
        json.dumps(run_view_to_dict(build_run_view(job, steps, {}, [], [], [job])))
    return (time.process_time() - start) / repeats * 1000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _urls(state: dict[str, Any], job_id: str) -> dict[str, list[str]]:
    services = {s["name"]: s for s in state["services"]}
    coord = services["coordinator"]
    http_port = next(a.split("=", 1)[1] for a in coord["args"] if a.startswith("--http-port="))
    base = f"http://127.0.0.1:{http_port}"
    others = [f"http://127.0.0.1:{s['metrics_port']}/metrics" for name, s in services.items()
              if name != "coordinator"]
    return {"ui_view": [f"{base}/ui/api/jobs/{job_id}/view"],
            "v1_view": [f"{base}/v1/jobs/{job_id}/view"],
            "metrics_coordinator": [f"http://127.0.0.1:{coord['metrics_port']}/metrics"],
            "metrics_all": others}


def measure(state: dict[str, Any], job_id: str, token: str,
            duration_s: float) -> dict[str, list[float]]:
    """Latencies (ms) per target, requests sent one after another in turn."""
    urls = _urls(state, job_id)
    samples: dict[str, list[float]] = {name: [] for name in TARGETS}
    turn = 0
    with httpx.Client(headers={"Authorization": f"Bearer {token}"},
                      cookies={"libra_ui_token": token}, timeout=10.0) as http:
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            for name in TARGETS:
                url = urls[name][turn % len(urls[name])]
                start = time.perf_counter()
                resp = http.get(url)
                samples[name].append((time.perf_counter() - start) * 1000)
                resp.raise_for_status()
            turn += 1
    return samples


async def _job(state: dict[str, Any], num_steps: int) -> str:
    client = stack.coordinator_client(state, timeout_s=120.0)
    try:
        job = await client.create_job(job_spec(num_steps), "json")
        while (await client.get_job(job.job_id))[0].step < 1:
            await asyncio.sleep(0.5)
        return job.job_id
    finally:
        await client.close()


async def _step_and_cancel(state: dict[str, Any], job_id: str, cancel: bool) -> int:
    client = stack.coordinator_client(state)
    try:
        step = (await client.get_job(job_id))[0].step
        if cancel:
            await client.cancel_job(job_id)
        return step
    finally:
        await client.close()


def run(duration_s: float, num_steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        run_root = Path(tmp)
        state = stack.up(run_root, timeout_s=180)
        try:
            token = (secrets_dir(run_root) / "api_token").read_text().strip()
            job_id = asyncio.run(_job(state, num_steps))
            step_before = asyncio.run(_step_and_cancel(state, job_id, False))
            samples = measure(state, job_id, token, duration_s)
            step_after = asyncio.run(_step_and_cancel(state, job_id, True))
        finally:
            stack.down(run_root)
    return {"duration_s": duration_s, "job_steps": [step_before, step_after],
            "load_average_1m": round(os.getloadavg()[0], 1), "num_cpus": os.cpu_count(),
            "targets": {name: {"samples": len(v),
                               "p50_ms": round(statistics.median(v), 2),
                               "p99_ms": round(percentile(v, 0.99), 2),
                               "max_ms": round(max(v), 2)} for name, v in samples.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--num-steps", type=int, default=400)
    parser.add_argument("--history-steps", type=int, nargs="*", default=[100, 1000, 5000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.duration_s, args.num_steps)
    result["view_cpu_ms"] = {str(n): round(view_cpu_ms(n), 2) for n in args.history_steps}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    steps = result["job_steps"]
    print(f"job steps {steps[0]} -> {steps[1]} during {args.duration_s:.0f} s; load average "
          f"{result['load_average_1m']} on {result['num_cpus']} CPUs")
    for name, r in result["targets"].items():
        print(f"{name:<20} n={r['samples']:<6} p50 {r['p50_ms']:7.2f} ms  p99 "
              f"{r['p99_ms']:7.2f} ms  max {r['max_ms']:7.2f} ms")
    for n, ms in result["view_cpu_ms"].items():
        print(f"view build + encode, {n:>5} steps: {ms:7.2f} CPU ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
