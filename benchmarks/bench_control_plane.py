"""The control plane at scale: N synthetic rollout instances against the real coordinator
and scheduler processes over gRPC + Redis.

Starts a real redis-server, ``python -m services.coordinator`` and ``python -m
services.scheduler`` (their own processes, as deployed), then ``--drivers`` child
processes whose asyncio tasks are the instances (benchmarks/control_plane_fleet.py).
Every instance keeps its lease through the real client (AcquireLease, then every TTL/3
one RenewLeases call per driver for all its instances, or with ``--renewals single`` a
RenewLease per instance). With ``--workload rollout`` (the default) they also do an instance's work
through the real protocol: a job whose prompt set fills every instance to
``--per-instance`` trajectories (100 x 1,000 instances = 100,000 in flight) is written
by the coordinator's store and started over the scheduler's StartJob; the instances
take trajectories from their inboxes, report tool returns on the ``ToolReturns``
stream (the scheduler decides stays and moves; a move is handed off), and publish
finished trajectories, which the scheduler reads back to give their slots away again.
This script stands in for the trainer: it counts finished groups as trained
(``trained_groups``), so admission goes on.

Measured over the window, after the fill (``--workload leases``: leases only):

- scheduler tick p50/p99 (``libra_scheduler_tick_seconds``, upper bucket bound, and the
  p99 interpolated within its bucket), the tick's own steps' wall and CPU p50/p99
  (``libra_scheduler_tick_own_seconds``, ``_cpu_seconds``: without the waits for Redis
  and the reports served meanwhile), server
  decision-batch p99 (``libra_scheduler_decide_batch_seconds``), decisions/s
  (``libra_scheduler_decisions_total``) from the scheduler's /metrics;
- client decision latency p50/p99 of probe reports (answered; the rest are unanswered
  stays, as the rollout core sends them), moves, finishes, fenced reports;
- renewals/s, renewal latency p50/p99/max, leases lost while their holder was alive;
- coordinator/scheduler/Redis/driver CPU (% of one core, /proc), Redis commands/s and
  memory (INFO), and the load average beside each figure.

The fleet drivers run at the lowest CPU priority by default (``--fleet-nice 19``). They
stand in for rollout hosts, which on a real cluster do not share the control plane's
cores; here 1,000 instances in two processes took most of the 2 cores, and the
scheduler and coordinator measured mostly their wait for a core. Niced, the fleet gets
what the control plane leaves, so the figures are the control plane's own (the fleet
falls behind instead: its loop lag and shed reports say by how much). ``--fleet-nice 19
0`` runs both arms alternately, the contended figures beside the control plane's own.

Usage: ``python benchmarks/bench_control_plane.py [--instances 100 300 1000]
[--seconds 30] [--workload rollout|leases] [--renewals batched single]
[--fleet-nice 19 0] [--trees BASE_TREE .] [--quick] [--json]`` (several ``--trees``,
``--renewals`` or ``--fleet-nice`` arms run alternately at each size).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from benchmarks.control_plane_stack import JOB, Stack  # noqa: E402
from benchmarks.host_watch import HostWatch  # noqa: E402
from libra import redis_keys as keys  # noqa: E402
from libra import types as t  # noqa: E402
from libra.clients.runner import GrpcSchedulerClient  # noqa: E402
from libra.clock import SystemClock  # noqa: E402
from libra.jobspec import job_spec_from_dict  # noqa: E402
from services.coordinator.store import RedisCoordinatorStore  # noqa: E402

BUCKETS = ["short", "long"]


def job_spec(instances: int, per_instance: int, samples: int) -> dict[str, Any]:
    """A job whose staleness budget exceeds the instances' capacity by one step: the
    caps bind, so every instance holds ``per_instance`` trajectories."""
    capacity = instances * per_instance
    per_step = min(4096, math.ceil(capacity / samples))
    return {
        "name": JOB,
        "task": {"name": "arith", "num_prompts": min(per_step * 4, 100_000)},
        "algorithm": {"prompts_per_step": per_step, "samples_per_prompt": samples,
                      "max_staleness": math.ceil(capacity / (per_step * samples))},
        "layout": {"policy": "cmlfq", "buckets": [
            {"name": "short", "max_tokens": 2_000, "max_trajectories_per_instance": per_instance},
            {"name": "long", "max_tokens": 16_000,
             "max_trajectories_per_instance": per_instance}]},
    }


def quantile_bound(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound (ms) of the histogram bucket holding quantile ``q`` of what was
    observed between the two scrapes."""
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = counts[-1][1] if counts else 0.0
    for le, cumulative in counts:
        if total and cumulative >= q * total:
            return round(1000 * le, 2)
    return 0.0


def quantile_estimate(before: dict[float, float], after: dict[float, float],
                      q: float) -> float:
    """Quantile ``q`` (ms) of what was observed between the two scrapes, interpolated
    linearly within its bucket (Prometheus's ``histogram_quantile``)."""
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = counts[-1][1] if counts else 0.0
    lower_le, lower_count = 0.0, 0.0
    for le, cumulative in counts:
        if total and cumulative >= q * total:
            if math.isinf(le):
                return round(1000 * lower_le, 2)
            share = (q * total - lower_count) / max(cumulative - lower_count, 1e-9)
            return round(1000 * (lower_le + share * (le - lower_le)), 2)
        lower_le, lower_count = le, cumulative
    return 0.0


def _count(before: dict[float, float], after: dict[float, float]) -> int:
    """Observations between the two scrapes."""
    top = max(after, default=None)
    return 0 if top is None else round(after[top] - before.get(top, 0.0))


def start_job(stack: Stack, args: argparse.Namespace, n: int) -> int:
    """The job written by the coordinator's own store (RUNNING: no trainer runs here, and
    the coordinator is told to wait for one), published weights, and StartJob over
    gRPC; returns the trajectories in flight to wait for."""
    spec = job_spec_from_dict(job_spec(n, args.per_instance, args.samples))
    now_ms = int(time.time() * 1000)
    job = t.Job(job_id=t.JobId(JOB), name=JOB, state=t.JobState.RUNNING,
                spec_json=spec.to_json(), created_at_ms=now_ms, updated_at_ms=now_ms)

    async def start() -> None:
        redis = aioredis.from_url(stack.redis.url, decode_responses=True)
        await RedisCoordinatorStore(redis, SystemClock()).put_job(job)
        await redis.aclose()
        client = GrpcSchedulerClient(stack.scheduler_address)
        await client.start_job(JOB)
        await client.close()

    stack.r.hset(keys.policy(JOB), mapping={"version": 0})
    asyncio.run(start())
    return n * args.per_instance


def train(stack: Stack, samples: int) -> None:
    """The trainer's part: every finished group is trained (the staleness budget moves)."""
    produced = int(stack.r.hget(keys.counters(JOB), "produced") or 0)
    trained = int(stack.r.hget(keys.counters(JOB), "trained_groups") or 0)
    if produced // samples > trained:
        stack.r.hincrby(keys.counters(JOB), "trained_groups", produced // samples - trained)


def run(n: int, args: argparse.Namespace, tmp: Path, renewals: str, nice: int,
        tag: str, tree: Path = ROOT) -> dict[str, Any]:
    arm = "" if tree == ROOT else f"-{tree.name}"
    watch = HostWatch().start()  # a host stall or a clock step expires leases too
    stack = Stack(tmp, f"{n}-{renewals}-nice{nice}-{tag}{arm}", args.profile,
                  args.lease_renewals_per_s, services_root=tree)
    try:
        base = {"instances": n, "buckets": BUCKETS, "redis_url": stack.redis.url,
                "job_id": JOB, "seed": 0, "ttl_ms": args.ttl_ms, "channels": 2,
                "coordinator": stack.coordinator_address,
                "mode": "instances" if args.workload == "rollout" else "leases",
                "scheduler": stack.scheduler_address, "block_ms": 1000, "period_s": 1.0,
                "probe_share": 0.05, "reports_per_s": args.reports_per_s,
                "max_in_flight": args.max_in_flight,
                "finishes_per_s": args.finishes_per_s, "renewals": renewals,
                "nice": nice}
        per_driver = math.ceil(n / args.drivers)
        kill_per_driver = math.ceil(args.kill / args.drivers)
        for first in range(0, n, per_driver):
            stack.spawn({**base, "first": first, "count": min(per_driver, n - first),
                         "kill": kill_per_driver})
        for driver in stack.drivers:  # every lease held
            assert driver.stdout is not None
            json.loads(driver.stdout.readline())["ready"]
        result: dict[str, Any] = {"instances": n, "workload": args.workload,
                                  "renewals": renewals, "fleet_nice": nice,
                                  "services_tree": str(tree)}
        if args.workload == "rollout":
            target = start_job(stack, args, n)
            began = time.monotonic()
            # Past the timeout the window is measured with what is in flight by then
            # (``filled`` false says so).
            while (filled := stack.r.hlen(keys.assignments(JOB)) >= target) is False \
                    and time.monotonic() - began < args.fill_timeout_s:
                train(stack, args.samples)
                time.sleep(0.5)
            result.update(in_flight_target=target, filled=filled,
                          fill_s=round(time.monotonic() - began, 1))
        time.sleep(2.0)  # every renewal loop started
        for driver in stack.drivers:
            stack.command(driver, "mark")
        if args.profile == "window":
            stack.profile_signal(signal.SIGUSR1)
        first, load_before = stack.sample(), os.getloadavg()[0]
        deadline = time.monotonic() + (args.quick_timeout_s if args.quick else args.seconds)
        while time.monotonic() < deadline:
            train(stack, args.samples)
            time.sleep(0.5)
            if args.quick and _quick_done(stack, first):
                break
        last = stack.sample()
        if args.profile == "window":
            stack.profile_signal(signal.SIGUSR2)
        result["in_flight"] = stack.r.hlen(keys.assignments(JOB))
        for driver in stack.drivers:
            stack.command(driver, "stop")
        summaries = [json.loads(d.communicate(timeout=120)[0].splitlines()[-1])
                     for d in stack.drivers]
        result.update(_figures(first, last, summaries, stack))
        result["loadavg"] = [load_before, *os.getloadavg()]
        return result | watch.stop()
    finally:
        watch.stop()
        stack.stop()


def _quick_done(stack: Stack, first: dict[str, Any]) -> bool:
    """The smoke test's window: a few decisions and finishes seen (not a time)."""
    now = stack.sample()
    return (now["metrics"]["decisions"] - first["metrics"]["decisions"] >= 20
            and now["produced"] - first["produced"] >= 8)


def _figures(first: dict[str, Any], last: dict[str, Any], summaries: list[dict[str, Any]],
             stack: Stack) -> dict[str, Any]:
    wall_s = last["t"] - first["t"]
    fleet = [s for s in summaries if "reports" in s]
    out: dict[str, Any] = {
        "window_s": round(wall_s, 1),
        "renewals_per_s": round(sum(s["renewals"] for s in summaries) / wall_s, 1),
        # RPCs that carried them (batched: one per driver and beat).
        "renew_calls_per_s": round(sum(s["renew_calls"] for s in summaries) / wall_s, 1),
        # The drivers' renewals together: the worst driver's (a conservative merge).
        "renew_p50_ms": max(s["renew_p50_ms"] for s in summaries),
        "renew_p99_ms": max(s["renew_p99_ms"] for s in summaries),
        "renew_max_ms": max(s["renew_max_ms"] for s in summaries),
        # How late the drivers' loops ran a timer: a holder starved of CPU renews late.
        "driver_loop_lag_p99_ms": max(s["loop_lag_p99_ms"] for s in summaries),
        "driver_loop_lag_max_ms": max(s["loop_lag_max_ms"] for s in summaries),
        "lease_ttl_ms": max(s["ttl_ms_max"] for s in summaries),
        # Leases lost while their holder was alive and renewing (the guarantee: 0).
        "leases_lost": sum(s["lost"] for s in summaries),
        "leases_lost_with_fill": sum(s["lost_total"] for s in summaries),
        # Of those, lost while the drivers were still registering (before "ready").
        "leases_lost_registering": sum(s["lost_registering"] for s in summaries),
        # A few lapses: (s after the driver was ready, TTL held ms, ms since renewed).
        "lapse_samples": sorted(x for s in summaries for x in s["lapses"])[:10],
        "renew_errors": sum(s["renew_errors"] for s in summaries),
        # Killed at the mark on purpose: their leases must have expired by the end.
        "killed": sum(len(s["killed"]) for s in summaries),
        "killed_expired": sum(not stack.r.exists(keys.lease(w))
                              for s in summaries for w in s["killed"]),
        "redis_ops_per_s": round((last["redis_cmds"] - first["redis_cmds"]) / wall_s),
        "redis_used_memory_mb": round(stack.r.info("memory")["used_memory"] / 2**20, 1),
    }
    for name, cpu in last["cpu"].items():
        out[f"{name}_cpu_pct"] = round(100 * (cpu - first["cpu"].get(name, 0.0)) / wall_s, 1)
    m0, m1 = first["metrics"], last["metrics"]
    for short, name in (("tick", "libra_scheduler_tick_seconds"),
                        ("tick_own", "libra_scheduler_tick_own_seconds"),
                        ("tick_cpu", "libra_scheduler_tick_cpu_seconds"),
                        ("decide_batch", "libra_scheduler_decide_batch_seconds"),
                        # Batches parked while a tick ran (SchedulerCore.tick_done).
                        ("tick_wait", "libra_scheduler_report_tick_wait_seconds")):
        if name in m1:
            for q in (0.5, 0.99):
                out[f"{short}_p{round(q * 100)}_ms"] = quantile_bound(m0.get(name, {}),
                                                                      m1[name], q)
            # Within the bucket, as Prometheus's histogram_quantile estimates it: the
            # base tree's buckets are coarse above 100 ms (250-500, 500-1,000).
            out[f"{short}_p99_est_ms"] = quantile_estimate(m0.get(name, {}), m1[name],
                                                           0.99)
            out[f"{short}_count"] = _count(m0.get(name, {}), m1[name])
    out["decisions_per_s"] = round((m1["decisions"] - m0["decisions"]) / wall_s, 1)
    out["finished_per_s"] = round((last["produced"] - first["produced"]) / wall_s, 1)
    if fleet:
        for key in ("reports", "moves", "handoffs", "finished", "fenced", "errors", "shed",
                    "probes", "held"):
            out[key] = sum(s[key] for s in fleet)
        kinds: dict[str, int] = {}
        for s in fleet:
            for kind, count in s.get("error_kinds", {}).items():
                kinds[kind] = kinds.get(kind, 0) + count
        out["error_kinds"] = kinds
        # The drivers' probes together: the worst driver's p99 (a conservative merge).
        out["client_decision_p50_ms"] = max(s["p50_ms"] for s in fleet)
        out["client_decision_p99_ms"] = max(s["p99_ms"] for s in fleet)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--workload", choices=("rollout", "leases"), default="rollout")
    parser.add_argument("--per-instance", type=int, default=100,
                        help="trajectories each instance holds (the bucket cap)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--reports-per-s", type=float, default=2.0,
                        help="tool-return reports per instance per second")
    parser.add_argument("--finishes-per-s", type=float, default=0.2,
                        help="finished trajectories per instance per second")
    parser.add_argument("--max-in-flight", type=int, default=1024,
                        help="reports and publishes a driver has in flight at most; past "
                             "it reports are shed (counted) instead of queued")
    parser.add_argument("--drivers", type=int, default=2,
                        help="processes running the instances' work")
    parser.add_argument("--ttl-ms", type=int, default=3000,
                        help="lease TTL the instances ask for (the coordinator may grant "
                             "more: --lease-renewals-per-s)")
    parser.add_argument("--renewals", choices=("batched", "single"), nargs="+",
                        default=["batched"],
                        help="how the drivers renew: one RenewLeases call per driver and "
                             "beat (batched) or one RenewLease per instance (single, the "
                             "former way); several arms run alternately at each size")
    parser.add_argument("--fleet-nice", type=int, nargs="+", default=[19],
                        help="how much lower the fleet drivers' CPU priority is than the "
                             "control plane's (os.nice; 19: the lowest, the default; 0: "
                             "the same). The fleet stands in for other hosts, whose cores "
                             "the control plane does not share; at 19 it gets only the "
                             "CPU left over, so the figures are the control plane's own. "
                             "Several values run as alternated arms (19 0: side by side "
                             "with the contended figures)")
    parser.add_argument("--trees", nargs="+", default=[],
                        help="source trees the coordinator and scheduler run from, as "
                             "alternated arms (e.g. a base worktree and this one; the "
                             "fleet runs from this tree); default: this tree")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each size (the arms alternate within each)")
    parser.add_argument("--lease-renewals-per-s", type=float, default=250.0,
                        help="the coordinator's lease_renewals_per_s (0: TTLs as asked)")
    parser.add_argument("--kill", type=int, default=0,
                        help="instances that die at the start of the window (stop renewing "
                             "and working); their leases must expire within it")
    parser.add_argument("--fill-timeout-s", type=float, default=600.0,
                        help="measure anyway once the fill took this long")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 4 instances x 8 trajectories, a window that "
                             "ends after 20 decisions and 8 finishes")
    parser.add_argument("--quick-timeout-s", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="one JSON line per run")
    parser.add_argument("--profile", nargs="?", const="run", default="",
                        choices=("run", "window"),
                        help="run the scheduler under cProfile (scheduler-<size>-<arm>-<i>.prof "
                             "in --log-dir): the whole run, or with 'window' the measured "
                             "window only (the steady state, without start-up and fill)")
    parser.add_argument("--log-dir", help="keep the services' logs and Redis files here "
                                          "(default: a temporary folder, removed)")
    args = parser.parse_args()
    # SIGTERM ends the run like Ctrl-C: the services and drivers are stopped (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.instances, args.per_instance, args.drivers = [4], 8, 1
        args.reports_per_s, args.finishes_per_s, args.ttl_ms = 5.0, 1.0, 30_000
        # The smoke test measures nothing: a niced fleet would only make it slower when
        # the host is busy.
        args.fleet_nice = [0]
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.instances:
            for i in range(args.repeat):
                for tree in [Path(x).resolve() for x in args.trees] or [ROOT]:
                    for renewals in args.renewals:
                        for nice in args.fleet_nice:
                            result = run(n, args, Path(args.log_dir or tmp), renewals,
                                         nice, str(i), tree)
                            print(json.dumps(result) if args.json else _text(result),
                                  flush=True)


def _text(r: dict[str, Any]) -> str:
    lines = [f"{r['instances']} instances ({r['workload']}, {r['renewals']} renewals, "
             f"services from {r['services_tree']}, "
             f"fleet nice +{r['fleet_nice']}), "
             f"window {r['window_s']} s, "
             f"load {r['loadavg']}:"]
    if r["workload"] == "rollout":
        lines.append(f"  in flight {r['in_flight']} (fill {r['fill_s']} s); tick p50 "
                     f"{r['tick_p50_ms']} ms p99 {r['tick_p99_ms']} ms (est. "
                     f"{r['tick_p99_est_ms']}; own p99 {r.get('tick_own_p99_ms', '-')}, CPU "
                     f"p99 {r.get('tick_cpu_p99_ms', '-')} ms); {r['decisions_per_s']}"
                     f" decisions/s, batch p99 {r['decide_batch_p99_ms']} ms (server; wait "
                     f"for the tick p99 {r.get('tick_wait_p99_est_ms', '-')} ms), "
                     f"client p99 {r['client_decision_p99_ms']} ms; {r['finished_per_s']}"
                     f" finished/s; moves {r['moves']}, fenced {r['fenced']}")
    lines.append(f"  {r['renewals_per_s']} renewals/s in {r['renew_calls_per_s']} calls/s "
                 f"(TTL {r['lease_ttl_ms']} ms), p99 "
                 f"{r['renew_p99_ms']} ms, lost {r['leases_lost']} (fill included "
                 f"{r['leases_lost_with_fill']}, registering "
                 f"{r['leases_lost_registering']}), killed {r['killed']} expired "
                 f"{r['killed_expired']}, driver loop lag p99 {r['driver_loop_lag_p99_ms']}"
                 f" ms; Redis {r['redis_ops_per_s']} ops/s, "
                 f"{r['redis_used_memory_mb']} MB; host late max {r['host_late_max_ms']} "
                 f"ms, clock step {r['wall_clock_step_max_ms']} ms; CPU % " + ", ".join(
                     f"{k[:-8]} {v}" for k, v in r.items() if k.endswith("_cpu_pct")))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
