"""What the scheduler service costs a real run: an A/B of wall time, side by side in
one run, plus the scheduler's CPU per trajectory.

Arm ``service``: the stack as deployed - the scheduler is its own process; rollout
instances report tool returns over gRPC (batched) and it learns finishes from the
trajectory stream. Arm ``inproc``: the same stack and job, but placement is done in
the rollout process - the scheduler core (same policy, same Redis store) runs on the
rollout instances' event loop and they call it directly; there is no scheduler process
and no RPC. In both arms every rollout instance runs in one benchmark host process
(benchmarks/bench_scheduler_host.py), so the only difference is where placement runs.

Each round runs every arm once on fresh stacks, the order rotating from round to round
(service, inproc; inproc, service; ...); each run is the same demo-shaped job
(deploy/configs/demo.toml with --steps RL steps), timed by the coordinator (job created
to job ended). ``--also-linger-ms MS`` adds a third arm, the service with reports
batched over MS, to compare batching within the same rounds. Printed: every run's wall
time, the wall-time ratio service/inproc of every round (with mean, spread and a 95%
bootstrap interval) and of the means, CPU seconds and wake-ups (voluntary context
switches) per process, the scheduler process's CPU and wake-ups per trajectory (service
arms), the decisions' round trip and the time rollouts waited on decisions (only while
a move is pending), and migrations per RL step.

With ``--pin-trainer`` the trainer runs alone on CPU 0 and every other process on the
remaining CPUs in both arms, as in a deployment where training has its own device: the
scheduler's CPU then competes with the rollouts, not with the optimizer steps. Without
it the OS places every process, so on a small machine the scheduler's CPU slows the
CPU-bound trainer directly.

Usage: python benchmarks/bench_scheduler_overhead.py [--steps N] [--rounds R]
       [--policy cmlfq] [--json] [--no-decisions] [--report-linger-ms MS]
       [--report-max-unanswered N] [--also-linger-ms MS] [--pin-trainer]
       [--set SECTION.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procstat import cpu_s, wakeups  # this directory: run as a script

from libra.clients.coordinator import GrpcCoordinatorClient
from libra_cli.healthcheck import check
from libra_cli.launcher import DEFAULT_STACK, _plan
from libra_cli.redis_server import EmbeddedRedis, pid_alive, start_redis

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(ROOT)}


def woken_since(pid: int, before: dict[str, int]) -> int:
    """Wake-ups since ``before`` of the threads alive now (gRPC starts and ends worker
    threads: what a thread that ended did is not counted)."""
    return sum(n - before.get(tid, 0) for tid, n in wakeups(pid).items())


def job_spec(steps: int, policy: str, overrides: Sequence[str] = ()) -> str:
    """The demo's spec with ``steps`` RL steps, the policy, and ``SECTION.KEY=VALUE``
    overrides (VALUE in TOML: ``model.hidden_size=256``)."""
    spec = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec["algorithm"].update({"num_steps": steps, "sft_steps": 200})
    spec["layout"]["policy"] = policy
    for item in overrides:
        path, _, value = item.partition("=")
        section, _, key = path.rpartition(".")
        if not section or section not in spec or not value:
            raise SystemExit(f"--set {item!r}: expected SECTION.KEY=VALUE, SECTION in "
                             f"{sorted(spec)}")
        spec[section][key] = tomllib.loads(f"v = {value}")["v"]
    return json.dumps(spec)


@dataclass
class Stack:
    redis: EmbeddedRedis
    procs: dict[str, subprocess.Popen]
    coordinator: str


# Process name -> the CPUs it may run on; empty unless --pin-trainer.
PINNED: dict[str, set[int]] = {}


def pin_trainer() -> None:
    """The trainer alone on CPU 0, every other process (this one included) on the rest."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2 or 0 not in cpus:
        raise SystemExit("--pin-trainer needs CPU 0 and at least one more CPU")
    PINNED.update({"trainer": {0}, "other": cpus - {0}})
    os.sched_setaffinity(0, PINNED["other"])


def _spawn(args: list[str], log: Path, name: str) -> subprocess.Popen:
    cpus = PINNED.get(name, PINNED.get("other"))
    # Set in the child before exec, so every thread it starts inherits the CPU set.
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(log, "ab") as out:
        return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=ENV,
                                preexec_fn=pin)


def _wait_serving(addresses: list[str], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(check(a, timeout_s=1.0) != "SERVING" for a in addresses):
        if time.monotonic() > deadline:
            raise RuntimeError(f"services not serving within {timeout_s:.0f}s: {addresses}")
        time.sleep(0.3)


def start_stack(run_root: Path, mode: str, host_args: list[str]) -> Stack:
    """Redis, the services (no scheduler in ``inproc``) and the rollout host."""
    (run_root / "logs").mkdir(parents=True)
    redis = start_redis(run_root / "redis")
    layout = tomllib.loads(DEFAULT_STACK.read_text())
    plan = _plan({**layout, "rollout": []}, run_root, redis.url)
    services = [s for s in plan if not (mode == "inproc" and s.name == "scheduler")]
    procs = {s.name: _spawn([sys.executable, "-m", s.module, *s.args],
                            run_root / "logs" / f"{s.name}.log", s.name) for s in services}
    _wait_serving([s.address for s in services])
    ports = {s.name: s.port for s in plan}
    host = [sys.executable, str(ROOT / "benchmarks" / "bench_scheduler_host.py"),
            f"--mode={mode}", f"--redis-url={redis.url}",
            f"--coordinator=127.0.0.1:{ports['coordinator']}",
            f"--toolgateway=127.0.0.1:{ports['toolgateway']}",
            f"--scheduler-port={ports['scheduler']}", *host_args]
    for inst in layout["rollout"]:
        host.append(f"--rollout={inst['instance_id']}:{inst['bucket']}:"
                    f"{inst['max_batch_size']}:{inst['max_trajectories']}")
    procs["rollout-host"] = _spawn(host, run_root / "logs" / "rollout-host.log", "rollout-host")
    _wait_ready(run_root / "logs" / "rollout-host.log", procs["rollout-host"])
    return Stack(redis, procs, f"127.0.0.1:{ports['coordinator']}")


def _wait_ready(log: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until the host printed READY: its instances hold leases (and, in ``inproc``, the
    scheduler API serves), so no start-up work falls into the measured job."""
    deadline = time.monotonic() + timeout_s
    while b"READY" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"rollout host not ready; see {log}")
        time.sleep(0.2)


def stop_stack(stack: Stack) -> None:
    """SIGTERM every process by pid (the rollout host first, so it can release its
    leases), SIGKILL what lingers, then Redis."""
    deadline = time.monotonic() + 15.0
    for proc in sorted(stack.procs.values(), key=lambda p: p is not stack.procs["rollout-host"]):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        if proc is stack.procs["rollout-host"]:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
    for proc in stack.procs.values():
        while pid_alive(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    stack.redis.stop()


@dataclass
class JobResult:
    wall_s: float  # the coordinator's: job created to job ended
    create_s: float  # the CreateJob call (the scheduler's start_job included)
    polled_s: float  # from CreateJob's return until a poll saw the end (0.2 s steps)
    counters: dict[str, int]
    steps: list[dict]


async def run_job(address: str, spec: str) -> JobResult:
    """Runs the job. Its wall time is the coordinator's, from creation to the end, in
    ms: polling the state would round every run to the poll period."""
    client = GrpcCoordinatorClient(address)
    started = time.perf_counter()
    job = await client.create_job(spec, "json")
    created = time.perf_counter()
    while True:
        job, steps, counters = await client.get_job(job.job_id)
        if job.state.is_terminal:
            break
        await asyncio.sleep(0.2)
    polled_s = time.perf_counter() - created
    await client.close()
    if job.state.value != "succeeded":
        raise RuntimeError(f"job ended {job.state.value}: {job.message}")
    return JobResult((job.updated_at_ms - job.created_at_ms) / 1000, created - started,
                     polled_s, counters, steps)


def run_arm(mode: str, spec: str, host_args: list[str]) -> dict[str, Any]:
    run_root = Path(tempfile.mkdtemp(prefix=f"libra-bench-{mode}-"))
    stack = start_stack(run_root, mode, host_args)
    try:
        before = {name: cpu_s(p.pid) for name, p in stack.procs.items()}
        woken = {name: wakeups(p.pid) for name, p in stack.procs.items()}
        cpus = {name: sorted(os.sched_getaffinity(p.pid)) for name, p in stack.procs.items()}
        job = asyncio.run(run_job(stack.coordinator, spec))
        counters, steps = job.counters, job.steps
        used = {name: cpu_s(p.pid) - before[name] for name, p in stack.procs.items()}
        woken = {name: woken_since(p.pid, woken[name]) for name, p in stack.procs.items()}
    finally:
        stop_stack(stack)
    host_log = (run_root / "logs" / "rollout-host.log").read_text()
    # A run leaves ~65 MB (weights of every version); a failed run keeps it for its logs.
    shutil.rmtree(run_root, ignore_errors=True)
    decisions = next((line for line in host_log.splitlines() if line.startswith("DECISIONS")),
                     "")
    moves = next((line for line in host_log.splitlines() if line.startswith("MOVES")), "")
    reports = next((line for line in host_log.splitlines() if line.startswith("REPORTS")), "")
    produced = counters.get("produced", 0) + counters.get("failed", 0)
    out: dict[str, Any] = {"mode": mode, "wall_s": round(job.wall_s, 3),
                           "create_s": round(job.create_s, 3),
                           "polled_s": round(job.polled_s, 2), "trajectories": produced,
                           "migrations": counters.get("migrations", 0),
                           "cpu_s": {k: round(v, 2) for k, v in used.items()},
                           "cpu_total_s": round(sum(used.values()), 2),
                           "wakeups": woken,
                           **({"cpus": cpus} if PINNED else {}),
                           "decisions": decisions.removeprefix("DECISIONS "),
                           "moves": moves.removeprefix("MOVES "),
                           # Where the trainer's steps went: waiting for data vs training.
                           "step_rollout_s": round(sum(s["rollout_s"] for s in steps), 3),
                           "step_train_s": round(sum(s["train_s"] for s in steps), 3)}
    if reports:  # service arm: tool-return reports, the batches and streams that carried them
        out["reports"] = reports.removeprefix("REPORTS ")
    if "scheduler" in used:
        out["scheduler_cpu_ms_per_trajectory"] = round(
            1000 * used["scheduler"] / max(produced, 1), 3)
        out["scheduler_cpu_share"] = round(used["scheduler"] / sum(used.values()), 4)
    return out


def summarise(runs: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per arm means; the wall-time ratio of every round (one run of each arm) to the
    in-process arm's run of that round, with mean, spread and interval."""
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    rounds: dict[int, dict[str, dict[str, Any]]] = {}
    for r in runs:
        rounds.setdefault(r["round"], {})[r["arm"]] = r
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in arms}
    walls = {a: [r["wall_s"] for r in rs] for a, rs in by_arm.items()}
    ratios = [g["service"]["wall_s"] / g["inproc"]["wall_s"] for g in rounds.values()]
    services = [a for a in arms if a != "inproc"]
    out = {
        "wall_s_mean": {a: round(statistics.mean(w), 2) for a, w in walls.items()},
        "wall_ratio_service_over_inproc": round(
            statistics.mean(walls["service"]) / statistics.mean(walls["inproc"]), 4),
        "pair_ratios": [round(x, 4) for x in ratios],
        "pair_ratio_mean": round(statistics.mean(ratios), 4),
        "pair_ratio_stdev": round(statistics.stdev(ratios), 4) if len(ratios) > 1 else 0.0,
        "pair_ratio_mean_ci95": bootstrap_ci95(ratios),
    }
    if "service_linger" in arms:
        for base in ("inproc", "service"):
            linger = [g["service_linger"]["wall_s"] / g[base]["wall_s"] for g in rounds.values()]
            out[f"service_linger_over_{base}"] = {
                "mean": round(statistics.mean(linger), 4), "ci95": bootstrap_ci95(linger)}
    return {
        **out,
        "scheduler_cpu_ms_per_trajectory": {a: round(statistics.mean(
            r["scheduler_cpu_ms_per_trajectory"] for r in by_arm[a]), 3) for a in services},
        "scheduler_wakeups_per_trajectory": {a: round(statistics.mean(
            r["wakeups"]["scheduler"] / max(r["trajectories"], 1) for r in by_arm[a]), 2)
            for a in services},
        "step_rollout_s_mean": {a: round(statistics.mean(
            r["step_rollout_s"] for r in rs), 3) for a, rs in by_arm.items()},
        "step_train_s_mean": {a: round(statistics.mean(
            r["step_train_s"] for r in rs), 3) for a, rs in by_arm.items()},
        "migrations_per_step_mean": {a: round(statistics.mean(
            r["migrations"] for r in rs) / steps, 2) for a, rs in by_arm.items()},
    }


def bootstrap_ci95(values: list[float], resamples: int = 10_000) -> list[float]:
    """95% percentile-bootstrap interval of the mean (seeded: reruns print the same)."""
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values)))
                   for _ in range(resamples))
    return [round(means[int(0.025 * resamples)], 4), round(means[int(0.975 * resamples)], 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of one run per arm; the arms' order rotates")
    parser.add_argument("--policy", default="cmlfq")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override the demo spec, e.g. --set model.hidden_size=256 "
                             "(how the cost scales with the work per trajectory)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--report-linger-ms", type=int, default=None,
                        help="service arm: batch reports over this window (default: the "
                             "rollout's report_linger_ms)")
    parser.add_argument("--report-max-unanswered", type=int, default=None,
                        help="service arm: all-stay batches the scheduler may leave "
                             "unanswered (default: the rollout's report_max_unanswered; 0 "
                             "answers every batch)")
    parser.add_argument("--also-linger-ms", type=int, default=None,
                        help="a third arm: the service with reports batched over this "
                             "window, in every round beside the other two")
    parser.add_argument("--no-decisions", action="store_true",
                        help="control: no tool-return reports in either arm (every tool "
                             "return stays, nothing moves), so only admission, placement "
                             "and finishes differ between the arms")
    parser.add_argument("--pin-trainer", action="store_true",
                        help="both arms: the trainer alone on CPU 0, every other process "
                             "on the remaining CPUs")
    args = parser.parse_args()
    if args.pin_trainer:
        pin_trainer()
    spec = job_spec(args.steps, args.policy, args.set)
    host_args = ["--no-decisions"] if args.no_decisions else []
    if args.report_linger_ms is not None:
        host_args.append(f"--report-linger-ms={args.report_linger_ms}")
    if args.report_max_unanswered is not None:
        host_args.append(f"--report-max-unanswered={args.report_max_unanswered}")
    arms = [("service", "service", host_args), ("inproc", "inproc", host_args)]
    if args.also_linger_ms is not None:
        arms.append(("service_linger", "service",
                     [*host_args, f"--report-linger-ms={args.also_linger_ms}"]))
    runs = []
    for i in range(args.rounds):
        # Every arm takes every position in turn (drift hits each alike).
        for arm, mode, arm_args in arms[i % len(arms):] + arms[:i % len(arms)]:
            runs.append({"arm": arm, "round": i, **run_arm(mode, spec, arm_args)})
            if not args.json:
                print(json.dumps(runs[-1]), flush=True)
    summary = {"policy": args.policy, "steps": args.steps, "pin_trainer": args.pin_trainer,
               "runs": runs,
               **summarise(runs, args.steps)}
    if args.json:
        print(json.dumps(summary))
        return
    for key, value in summary.items():
        if key != "runs":
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
