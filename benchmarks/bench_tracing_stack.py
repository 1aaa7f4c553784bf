"""Where tracing's cost goes on the real stack: the demo on `libra up` (Redis and the five
services as processes, gRPC between them) with tracing off and on, arms alternated.

`bench_tracing.py` measures the in-process loop, where only trajectory spans exist. A
service that exports also installs the OpenTelemetry SDK and instruments gRPC and Redis
(``libra.telemetry.init_tracing``); this benchmark counts what each service exports, by
instrumentation scope (``libra.trajectory``, ``opentelemetry.instrumentation.grpc``,
``...redis``, the scheduler's own), and the CPU seconds of every service process (and
Redis) from the first RL step to the job's end, read from ``/proc`` (steadier than wall
time on a shared machine). Arms:

- ``off``: no OTLP endpoint;
- ``default``: ``LIBRA_TELEMETRY__OTLP_ENDPOINT`` set, the job's default sampling (no
  ``OTEL_TRACES_SAMPLER``: gRPC and Redis not instrumented);
- ``full``: the same with ``trace_sample_ratio = 1.0``;
- ``full_instr``: ``full`` with ``OTEL_TRACES_SAMPLER=parentbased_always_off`` (gRPC and
  Redis instrumented, recorded only under a sampled caller: here, never);
- ``full_auto``: ``full`` with ``OTEL_TRACES_SAMPLER=parentbased_always_on`` (the SDK's
  own default: every gRPC call and Redis command a span of its own).

Usage: python benchmarks/bench_tracing_stack.py [--rounds 2] [--num-steps 6]
       [--sft-steps 300] [--arms off,default,full,full_instr,full_auto] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import tomllib
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("off", "default", "full", "full_instr", "full_auto")
# OTEL_TRACES_SAMPLER of the services, per arm (absent: unset)
SAMPLERS = {"full_instr": "parentbased_always_off", "full_auto": "parentbased_always_on"}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Receiver:
    """An OTLP TraceService in this process counting spans by (service, scope)."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        outer = self

        class Servicer(pb_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802, ANN001
                with outer._lock:
                    for res in request.resource_spans:
                        service = next((a.value.string_value for a in res.resource.attributes
                                        if a.key == "service.name"), "")
                        service = "rollout" if service.startswith("rollout") else service
                        for scope in res.scope_spans:
                            outer.counts[(service, scope.scope.name)] += len(scope.spans)
                return pb.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_TraceServiceServicer_to_server(Servicer(), self._server)
        self.endpoint = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def take(self) -> dict[str, int]:
        with self._lock:
            out = {f"{service}|{scope}": n for (service, scope), n in self.counts.items()}
            self.counts.clear()
        return out

    def stop(self) -> None:
        self._server.stop(grace=None)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its waited-for children; 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS


def pids(state: dict[str, Any]) -> dict[str, int]:
    out = {svc["name"]: int(svc["pid"]) for svc in state["services"]}
    if state.get("redis_pid"):
        out["redis"] = int(state["redis_pid"])
    return out


def job_spec(arm: str, num_steps: int, sft_steps: int) -> str:
    spec = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec["name"] = f"bench-tracing-stack-{arm}"
    spec["algorithm"].update({"num_steps": num_steps, "sft_steps": sft_steps})
    if arm.startswith("full"):
        spec["observability"] = {"trace_sample_ratio": 1.0}
    return json.dumps(spec)


async def run_job(state: dict[str, Any], spec_json: str) -> dict[str, Any]:
    """Submit, note every process's CPU at the first RL step and at the end."""
    from libra_cli import stack

    client = stack.coordinator_client(state)
    procs = pids(state)
    job = await client.create_job(spec_json, "json")
    at_start = {name: cpu_s(pid) for name, pid in procs.items()}
    first: dict[str, float] | None = None
    while True:
        job, steps, counters = await client.get_job(job.job_id)
        if first is None and job.step >= 1:
            first = {name: cpu_s(pid) for name, pid in procs.items()}
        if job.state.is_terminal:
            break
        await asyncio.sleep(0.1)
    end = {name: cpu_s(pid) for name, pid in procs.items()}
    await client.close()
    first = first or end
    return {"state": job.state.value, "trained": counters.get("trained", 0),
            "rl_wall_s": sum(s["wall_s"] for s in steps),
            "job_cpu_s": {n: end[n] - at_start[n] for n in procs},
            "rl_cpu_s": {n: end[n] - first[n] for n in procs}}


def one_run(arm: str, receiver: Receiver, args: argparse.Namespace) -> dict[str, Any]:
    from libra_cli import stack

    env_before = dict(os.environ)
    if arm != "off":
        os.environ["LIBRA_TELEMETRY__OTLP_ENDPOINT"] = receiver.endpoint
    os.environ.pop("OTEL_TRACES_SAMPLER", None)
    if arm in SAMPLERS:
        os.environ["OTEL_TRACES_SAMPLER"] = SAMPLERS[arm]
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tracing-stack-") as tmp:
            state = stack.up(Path(tmp), timeout_s=180)
            try:
                receiver.take()  # start-up spans (health probes are filtered; others)
                result = asyncio.run(run_job(state, job_spec(arm, args.num_steps,
                                                             args.sft_steps)))
                time.sleep(3.0)  # the services' export threads (every 2 s) send the rest
            finally:
                stack.down(Path(tmp))
            result["spans"] = receiver.take()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    result["arm"] = arm
    return result


# -- micro: one Redis command and one gRPC call, plain / patched / recording ----------------

MICRO_MODES = ("plain", "patched", "recording")


def micro_run(mode: str, endpoint: str) -> dict[str, float]:
    """Process CPU microseconds per Redis GET and per unary gRPC call (client and server
    in this process) with the libraries unpatched, patched under the services' sampler
    when ``OTEL_TRACES_SAMPLER`` is ``parentbased_always_off`` (nothing recorded), and
    patched recording every call (exported over OTLP to ``endpoint``; the batch
    processor's thread exports while the calls run, and process CPU counts it)."""
    from libra import telemetry
    from libra.service_config import TelemetryConfig
    from libra_cli.redis_server import start_redis

    if mode != "plain":
        from opentelemetry import trace

        os.environ["OTEL_TRACES_SAMPLER"] = ("parentbased_always_off" if mode == "patched"
                                             else "parentbased_always_on")
        provider = telemetry.build_provider("bench-micro", TelemetryConfig(
            otlp_endpoint=endpoint))
        assert provider is not None
        trace.set_tracer_provider(provider)
        telemetry.instrument_libraries()
    with tempfile.TemporaryDirectory(prefix="bench-tracing-micro-") as tmp:
        redis_server = start_redis(Path(tmp), appendonly=False)
        try:
            result = asyncio.run(time_calls(redis_server.url))
        finally:
            redis_server.process.terminate()  # by pid: the child this run started
            redis_server.process.wait(timeout=10)
    return {k: round(v, 1) for k, v in result.items()}


async def time_calls(redis_url: str, num_calls: int = 3000) -> dict[str, float]:
    """CPU microseconds per GET on ``redis_url`` and per call to an empty TraceService
    served in this process."""
    import grpc
    import redis.asyncio as aioredis
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

    class Echo(pb_grpc.TraceServiceServicer):
        async def Export(self, request, context):  # noqa: N802, ANN001
            return pb.ExportTraceServiceResponse()

    server = grpc.aio.server()
    pb_grpc.add_TraceServiceServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.TraceServiceStub(channel)
    client = aioredis.Redis.from_url(redis_url)
    await client.set("k", "v")
    out = {}
    for name, call in (("redis_get_us", lambda: client.get("k")),
                       ("grpc_call_us", lambda: stub.Export(pb.ExportTraceServiceRequest()))):
        for _ in range(200):  # warm
            await call()
        started = time.process_time()
        for _ in range(num_calls):
            await call()
        out[name] = (time.process_time() - started) / num_calls * 1e6
    await client.aclose()
    await channel.close()
    await server.stop(None)
    return out


def micro(receiver: Receiver, rounds: int) -> dict[str, dict[str, float]]:
    """Each mode in a fresh process (the patches are process-wide), alternated; the
    median per figure."""
    import subprocess

    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MICRO_MODES}
    for _ in range(rounds):
        for mode in MICRO_MODES:
            out = subprocess.run([sys.executable, __file__, "--micro-mode", mode,
                                  "--endpoint", receiver.endpoint], capture_output=True,
                                 text=True, timeout=600, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
            for mode, rs in runs.items()}


def summarise(runs: list[dict[str, Any]], arms: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for measure in ("rl_cpu_s", "job_cpu_s"):
        totals = {arm: [sum(r[measure].values()) for r in runs if r["arm"] == arm]
                  for arm in arms}
        rounds = min(len(v) for v in totals.values())
        out[measure] = {
            "median": {arm: statistics.median(v) for arm, v in totals.items()},
            "paired_ratio_to_off": {arm: [totals[arm][i] / totals["off"][i]
                                          for i in range(rounds)] for arm in arms[1:]}}
        out[measure]["median_paired_ratio"] = {
            arm: statistics.median(v) for arm, v in out[measure]["paired_ratio_to_off"].items()}
    per_service: dict[str, dict[str, float]] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        per_service[arm] = {n: statistics.median(r["rl_cpu_s"][n] for r in mine)
                            for n in mine[0]["rl_cpu_s"]}
    out["rl_cpu_s_per_service_median"] = per_service
    out["spans_per_trained"] = {}
    for arm in arms[1:]:
        mine = [r for r in runs if r["arm"] == arm]
        keys = {k for r in mine for k in r["spans"]}
        out["spans_per_trained"][arm] = {
            k: round(statistics.median(r["spans"].get(k, 0) / max(r["trained"], 1)
                                       for r in mine), 2) for k in sorted(keys)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternated rounds of the arms")
    parser.add_argument("--num-steps", type=int, default=6, help="RL steps per run")
    parser.add_argument("--sft-steps", type=int, default=300, help="warm-start steps")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated, off first; of {ARMS}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--micro", type=int, default=3, metavar="ROUNDS",
                        help="rounds of the Redis/gRPC micro-benchmark (0: none)")
    parser.add_argument("--micro-mode", choices=MICRO_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.micro_mode:
        print(json.dumps(micro_run(args.micro_mode, args.endpoint)))
        return 0
    arms = tuple(args.arms.split(","))
    if arms[0] != "off" or not set(arms) <= set(ARMS):
        parser.error(f"--arms: off first, then some of {ARMS[1:]}")
    receiver = Receiver()
    runs, load_before = [], os.getloadavg()
    micro_us: dict[str, Any] = {}
    try:
        if args.micro:
            micro_us = micro(receiver, args.micro)
            print(f"micro (CPU us per call): {micro_us}", file=sys.stderr)
        for round_index in range(args.rounds):
            for arm in arms:
                run = one_run(arm, receiver, args)
                run["round"] = round_index
                runs.append(run)
                print(f"round {round_index} {arm}: rl cpu {sum(run['rl_cpu_s'].values()):.2f}s "
                      f"job cpu {sum(run['job_cpu_s'].values()):.2f}s rl wall "
                      f"{run['rl_wall_s']:.2f}s trained {run['trained']} {run['state']} "
                      f"spans {sum(run['spans'].values())} load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr)
    finally:
        receiver.stop()
    result = {"runs": runs, "summary": summarise(runs, arms) if runs else {},
              "micro_cpu_us_per_call": micro_us,
              "load_avg": {"before": load_before, "after": os.getloadavg()},
              "config": {"rounds": args.rounds, "arms": arms, "num_steps": args.num_steps,
                         "sft_steps": args.sft_steps}}
    print(json.dumps(result if args.json else result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
