"""What trajectory traces cost: the demo job with tracing off, with every trajectory
traced, and with the default sampling, in alternated runs.

Each run is a fresh process running the in-process loop (``libra run --in-process``: the
five real cores, one embedded Redis, the demo's tiny model on CPU) on the demo spec
shortened to ``--num-steps`` steps (its layout, C-MLFQ, prompts and samples per step;
``--sft-steps`` of warm start so the model calls tools and trajectories move). Arms:

- ``off``: no exporter (the services' default: the port returns at once);
- ``full``: ``trace_sample_ratio = 1.0``, spans exported the services' way
  (``telemetry.init_tracing``: trajectory spans queued, encoded to OTLP in batches on a
  thread; the SDK provider and Redis instrumentation installed, its spans sampled as
  ``OTEL_TRACES_SAMPLER`` says) over OTLP/gRPC to a receiver in another process (a
  minimal TraceService that counts spans);
- ``default``: the job's default sampling (every trajectory while a step trains on at most
  64; the demo's 8 x 4 = 32 is under that, so on the demo it equals ``full``; raise
  ``--prompts-per-step`` to see a ratio below 1);
- ``full_sdk`` (only with ``--arms``): every trajectory through the path ``full``
  replaced (an OTel SDK span each, the batch processor, the OTLP exporter).

Measured per run: the RL phase's wall time (the sum of the steps' ``wall_s``: what the
trainer waited for and trained on, warm start and model loads excluded); the wall and
CPU seconds of the process from the first reported step to the job's end (steady
state); the whole job's wall and CPU seconds (with the warm start). Printed: per arm
the median, and the ratio to ``off`` of the medians and of each round's pair (runs
alternate off/full/default, so a slow minute of a shared machine hits all arms alike).
Also the cost of one span through each path (micro: the SDK path and the services'), and
the spans a traced trajectory makes.

Usage: python benchmarks/bench_tracing.py [--rounds 3] [--num-steps 6]
       [--prompts-per-step 8] [--sft-steps 300] [--arms off,full,default] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent import futures
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARMS = ("off", "full", "default")
# The path "full" replaced (every trajectory through SDK spans and the OTLP exporter):
# ``--arms off,full,default,full_sdk`` measures both in the same alternated run.
ALL_ARMS = (*ARMS, "full_sdk")


# -- the OTLP receiver (its own process) -------------------------------------------------

def serve_receiver(port_file: Path) -> None:
    """A TraceService that counts the spans it is sent (written to ``port_file``.count)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc

    count_file = port_file.with_suffix(".count")
    received = [0]

    class Receiver(pb_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802, ANN001
            received[0] += sum(len(scope.spans) for res in request.resource_spans
                               for scope in res.scope_spans)
            tmp = count_file.with_suffix(".tmp")
            tmp.write_text(str(received[0]))
            tmp.replace(count_file)
            return pb.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_file.write_text(str(port))
    server.wait_for_termination()


def received_spans(port_file: Path) -> int:
    count_file = port_file.with_suffix(".count")
    return int(count_file.read_text()) if count_file.exists() else 0


# -- one run (its own process) -------------------------------------------------------------

def bench_spec(num_steps: int, prompts_per_step: int, sft_steps: int, arm: str) -> str:
    spec = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec["name"] = f"bench-tracing-{arm}"
    spec["algorithm"].update({"num_steps": num_steps, "prompts_per_step": prompts_per_step,
                              "sft_steps": sft_steps})
    if arm in ("full", "full_sdk"):
        spec["observability"] = {"trace_sample_ratio": 1.0}
    return json.dumps(spec)


async def one_run(arm: str, endpoint: str, spec_json: str) -> dict[str, Any]:
    from libra import telemetry, tracing
    from libra.jobspec import job_spec_from_json
    from libra.service_config import TelemetryConfig
    from libra.trace_export import OtelSpanSink
    from libra_cli.inprocess_loop import in_process_stack
    from tests.integration.stack_helpers import wait_for_job

    sink: Any = None
    cfg = TelemetryConfig(otlp_endpoint=endpoint)
    if arm == "full_sdk":
        sink = telemetry.build_provider("bench", cfg)
        tracing.set_sink(OtelSpanSink(sink))
    elif arm != "off":  # the services' path: the SDK for Redis spans, trajectory spans
        telemetry.init_tracing("bench", cfg)  # straight to OTLP
        sink = tracing._sink  # noqa: SLF001 - flushed and timed below
    caller_cpu = time_port_calls(tracing) if arm != "off" else [0.0]
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        async with in_process_stack(Path(tmp), job_spec_from_json(spec_json)) as inproc:
            started, cpu0 = time.perf_counter(), time.process_time()
            job = await inproc.coordinator.create_job(spec_json, "json")
            window = await rl_window(inproc.coordinator, job.job_id)
            job, steps, counters = await wait_for_job(inproc.coordinator, job.job_id,
                                                      timeout_s=1800)
            wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    export_cpu_s = 0.0
    if sink is not None:
        sink.force_flush()
        sink.shutdown()
        # The SDK's export thread is its own: "full_sdk" counts its callers' CPU only.
        export_cpu_s = getattr(sink, "export_cpu_s", 0.0)
    return {"arm": arm, "state": job.state.value, "rl_wall_s": sum(s["wall_s"] for s in steps),
            "caller_cpu_s": caller_cpu[0], "export_cpu_s": export_cpu_s,
            "window_wall_s": window[0], "window_cpu_s": window[1],
            "job_wall_s": wall_s, "cpu_s": cpu_s, "trained": counters.get("trained", 0),
            "migrations": counters.get("migrations", 0)}


def time_port_calls(tracing: Any) -> list[float]:
    """Wrap the port's recording functions (the services call them as
    ``tracing.<name>``) to add each call's CPU time on its thread to the returned
    one-element list: the cost tracing puts on the services' own threads, measured in
    CPU time, which a shared machine's load barely moves (the wrapper's two clock reads,
    ~0.2 us, are counted too)."""
    total = [0.0]
    for name in ("record_child", "record_span", "end_trajectory", "record_event"):
        inner = getattr(tracing, name)

        def timed(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            started_s = time.thread_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                total[0] += time.thread_time() - started_s

        setattr(tracing, name, timed)
    return total


async def rl_window(coordinator: Any, job_id: str) -> tuple[float, float]:
    """Wall and CPU seconds from the first reported RL step to the job's end: steady
    state, the warm start and the first step's model loads left out (polled every 0.1 s
    in every arm alike)."""
    first: tuple[float, float] | None = None
    while True:
        job, _steps, _counters = await coordinator.get_job(job_id)
        if first is None and job.step >= 1:
            first = (time.perf_counter(), time.process_time())
        if job.state.is_terminal:
            if first is None:
                return 0.0, 0.0
            return time.perf_counter() - first[0], time.process_time() - first[1]
        await asyncio.sleep(0.1)


# -- micro: one span through the exporter path ----------------------------------------------

def span_cost_us(endpoint: str, path: str, num_spans: int = 20_000, chunk: int = 500
                 ) -> dict[str, float]:
    """Microseconds per child span through ``path``: "otlp" (the services' sink: queued,
    encoded straight to OTLP on a thread of its own) or "sdk" (the OTel SDK path it
    replaced: an SDK span, the batch processor, the OTLP exporter). ``record`` is the
    caller's wall time in ``record_child``; ``cpu`` the process's CPU including the
    export thread's (spans recorded in chunks, each flushed, so no queue overflows)."""
    from libra import telemetry, tracing
    from libra.service_config import TelemetryConfig
    from libra.trace_export import OtelSpanSink

    cfg = TelemetryConfig(otlp_endpoint=endpoint)
    sink: Any
    if path == "otlp":
        sink = telemetry.build_span_sink("bench-micro", cfg)
    else:
        sink = telemetry.build_provider("bench-micro", cfg)
        tracing.set_sink(OtelSpanSink(sink))
    assert sink is not None
    if path == "otlp":
        tracing.set_sink(sink)
    parent = tracing.new_traceparent(sampled=True)
    record_s, cpu0 = 0.0, time.process_time()
    for start in range(0, num_spans, chunk):
        started = time.perf_counter()
        for i in range(start, start + chunk):
            tracing.record_child("rollout.generate", parent, i, i + 1, **{
                "libra.instance": "rollout-0", "libra.bucket": "short", "libra.turn": 1,
                "libra.batch_size": 8, "libra.tokens": 40, "libra.policy_version": 3,
                "libra.finish_reason": "stop"})
        record_s += time.perf_counter() - started
        sink.force_flush()
    cpu_s = time.process_time() - cpu0
    sink.shutdown()
    tracing.set_sink(None)
    return {"record": record_s / num_spans * 1e6, "cpu": cpu_s / num_spans * 1e6}


# -- the driver ------------------------------------------------------------------------------

def run_arm(arm: str, endpoint: str, spec_json: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--one-run", arm, "--endpoint", endpoint,
                          "--spec", spec_json], capture_output=True, text=True, env=env,
                         timeout=3600, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"run {arm} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def summarise(runs: list[dict[str, Any]], rounds: int, arms: tuple[str, ...]
              ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for measure in ("rl_wall_s", "window_wall_s", "window_cpu_s", "job_wall_s", "cpu_s"):
        med = {arm: statistics.median(r[measure] for r in runs if r["arm"] == arm)
               for arm in arms}
        paired = {arm: [runs[i * len(arms) + arms.index(arm)][measure]
                        / runs[i * len(arms)][measure] for i in range(rounds)]
                  for arm in arms[1:]}
        out[measure] = {"median": med,
                        "ratio_of_medians": {a: med[a] / med["off"] for a in arms[1:]},
                        "paired_ratios": paired,
                        "median_paired_ratio": {a: statistics.median(v)
                                                for a, v in paired.items()}}
    # Tracing's own CPU (the port's calls on the services' threads plus the export thread),
    # as a share of the run's CPU: the steady figure on a loaded machine. "as_ratio" is
    # the CPU ratio to an untraced run it implies (cpu / (cpu - tracing)).
    out["tracing_cpu"] = {}
    for arm in arms[1:]:
        mine = [r for r in runs if r["arm"] == arm]
        tracing_s = [r["caller_cpu_s"] + r["export_cpu_s"] for r in mine]
        shares = [t / r["cpu_s"] for t, r in zip(tracing_s, mine, strict=True)]
        # Over the RL window's CPU: an upper bound for a demo with a longer RL phase (the
        # window leaves the first step out, whose spans are counted in the numerator).
        rl_shares = [t / r["window_cpu_s"] for t, r in zip(tracing_s, mine, strict=True)]
        out["tracing_cpu"][arm] = {
            "median_s": statistics.median(tracing_s),
            "median_caller_s": statistics.median(r["caller_cpu_s"] for r in mine),
            "median_share_of_job_cpu": statistics.median(shares),
            "as_ratio": 1 / (1 - statistics.median(shares)),
            "median_share_of_rl_cpu": statistics.median(rl_shares),
            "rl_as_ratio": 1 / (1 - statistics.median(rl_shares)),
            "per_span_us": statistics.median(t / max(r["spans"], 1) * 1e6
                                             for t, r in zip(tracing_s, mine, strict=True))}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of the arms")
    parser.add_argument("--num-steps", type=int, default=6, help="RL steps per run")
    parser.add_argument("--prompts-per-step", type=int, default=8,
                        help="prompts per step (the demo's 8; 4 samples each)")
    parser.add_argument("--sft-steps", type=int, default=300,
                        help="warm-start steps (so the model calls tools)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"comma-separated arms in round order, off first; of {ALL_ARMS}")
    parser.add_argument("--one-run", choices=ALL_ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    parser.add_argument("--receiver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.arms = tuple(args.arms.split(","))
    if args.arms[0] != "off" or not set(args.arms) <= set(ALL_ARMS):
        parser.error(f"--arms: off first, then some of {ALL_ARMS[1:]}")
    if args.receiver:
        serve_receiver(Path(args.receiver))
        return 0
    if args.one_run:
        print(json.dumps(asyncio.run(one_run(args.one_run, args.endpoint, args.spec))))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-tracing-rx-") as tmp:
        port_file = Path(tmp) / "receiver.port"
        receiver = subprocess.Popen([sys.executable, __file__, "--receiver", str(port_file)],
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            while not port_file.exists():
                time.sleep(0.1)
            endpoint = f"127.0.0.1:{port_file.read_text().strip()}"
            result = drive(args, endpoint, port_file)
        finally:
            receiver.terminate()  # by pid: the process this driver started
            receiver.wait(timeout=10)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


def drive(args: argparse.Namespace, endpoint: str, port_file: Path) -> dict[str, Any]:
    runs = []
    load_before = os.getloadavg()
    for round_index in range(args.rounds):
        for arm in args.arms:
            before = received_spans(port_file)
            spec_json = bench_spec(args.num_steps, args.prompts_per_step, args.sft_steps, arm)
            run = run_arm(arm, endpoint, spec_json)
            run["spans"] = received_spans(port_file) - before
            run["round"] = round_index
            runs.append(run)
            print(f"round {round_index} {arm}: rl {run['rl_wall_s']:.2f}s window "
                  f"{run['window_wall_s']:.2f}s/{run['window_cpu_s']:.2f}s cpu, job "
                  f"{run['job_wall_s']:.2f}s cpu {run['cpu_s']:.2f}s spans {run['spans']} "
                  f"trained {run['trained']} moves {run['migrations']} {run['state']}",
                  file=sys.stderr)
    full = [r for r in runs if r["arm"] == "full"]
    spans_per_trained = statistics.median(r["spans"] / max(r["trained"], 1) for r in full)
    return {"runs": runs, "summary": summarise(runs, args.rounds, args.arms),
            "load_avg": {"before": load_before, "after": os.getloadavg()},
            "span_cost_us": {path: span_cost_us(endpoint, path) for path in ("sdk", "otlp")},
            "spans_per_trained_trajectory": spans_per_trained,
            "config": {"rounds": args.rounds, "arms": args.arms, "num_steps": args.num_steps,
                       "prompts_per_step": args.prompts_per_step,
                       "sft_steps": args.sft_steps}}


def print_table(result: dict[str, Any]) -> None:
    for measure, s in result["summary"].items():
        if measure == "tracing_cpu":
            for arm, cpu in s.items():
                print(f"tracing's own CPU ({arm}): median {cpu['median_s']:.3f} s (callers "
                      f"{cpu['median_caller_s']:.3f} s), {cpu['per_span_us']:.1f} us per "
                      f"span, {cpu['median_share_of_job_cpu']:.2%} of the job's CPU "
                      f"(ratio {cpu['as_ratio']:.4f}), {cpu['median_share_of_rl_cpu']:.2%} "
                      f"of the RL window's (ratio {cpu['rl_as_ratio']:.4f})")
            continue
        print(f"{measure}: medians " + ", ".join(f"{a} {v:.2f}" for a, v in s["median"].items()))
        for arm in result["config"]["arms"][1:]:
            paired = ", ".join(f"{x:.3f}" for x in s["paired_ratios"][arm])
            print(f"  {arm}/off: ratio of medians {s['ratio_of_medians'][arm]:.3f}; "
                  f"paired {paired} (median {s['median_paired_ratio'][arm]:.3f})")
    for path, cost in result["span_cost_us"].items():
        print(f"one span ({path}): {cost['record']:.1f} us in the caller, {cost['cpu']:.1f} "
              f"us of CPU with its export")
    print(f"spans exported per trained trajectory (full): "
          f"{result['spans_per_trained_trajectory']:.1f}; load average (1, 5, 15 min) "
          f"before {result['load_avg']['before']}, after {result['load_avg']['after']}")


if __name__ == "__main__":
    sys.exit(main())
