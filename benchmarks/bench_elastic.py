"""Elastic hybrid pool: does a join slow the core's steps, and how long does a move take?

The core (this process) trains the demo model on demo-shaped batches through the same
``ElasticTrainer`` the trainer service runs, with the gradient channel on a real gRPC
server. A hybrid worker runs in a second process (already started and idle, as a rollout
worker is before it is lent). After ``--before`` steps the hybrid is told to join; the
run continues until it has contributed ``--after`` steps.

Printed, side by side from one run: the core's step time (``train()`` only, the rollout
wait excluded) before the join, during it (the hybrid fetching state and catching up)
and with the hybrid active, their ratios, and the move latency: decision -> snapshot
sent -> hybrid active -> first step with its gradient merged. ``--json`` for machines.

    python -m benchmarks.bench_elastic [--before 12] [--after 8] [--wait-s 0.15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from libra import types as t
from libra.clock import SystemClock
from libra.jobspec import ElasticSpec, parse_job_spec
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from libra.training import channel as ch
from libra.training.backend import JobBackend
from libra.training.samples import TrainSample
from libra.types import GroupId, TrajectoryId
from services.trainer.elastic import GradientDomain
from services.trainer.elastic_step import ElasticTrainer
from services.trainer.servicer import GradientChannelServicer

ROOT = Path(__file__).resolve().parents[1]


def demo_batch(step: int, groups: int = 8, size: int = 4) -> list[TrainSample]:
    """Demo-shaped trajectories: ~100-170 tokens, a third of them generated."""
    rng = random.Random(step)
    samples = []
    for g in range(groups):
        for i in range(size):
            n = rng.randint(100, 170)
            trained = n // 3
            mask = [0] * (n - trained) + [1] * trained
            samples.append(TrainSample(
                token_ids=[rng.randint(3, 40) for _ in range(n)], loss_mask=mask,
                rollout_logprobs=[-1.2 * m for m in mask], advantage=rng.uniform(-1, 1),
                group_id=GroupId(f"s{step}g{g}"), trajectory_id=TrajectoryId(f"s{step}g{g}i{i}")))
    return samples


class SessionLeases:
    """Leases as the coordinator would hold them for the connected hybrids."""

    def __init__(self, domain: GradientDomain) -> None:
        self._domain = domain

    async def list_workers(self) -> list[t.Lease]:
        leases = []
        for s in self._domain.sessions.values():
            role = t.WorkerRole.HYBRID_TRAINING if s.active_epoch else t.WorkerRole.HYBRID_JOINING
            leases.append(t.Lease(t.WorkerId(s.worker_id), role, "long", "",
                                  s.active_epoch or s.hello.epoch, 0, 3000))
        return leases


class Timeline:
    def __init__(self) -> None:
        self.events: dict[str, float] = {}

    async def __call__(self, kind: str, **_fields: Any) -> None:
        self.events.setdefault(kind, time.perf_counter())


def demo_spec() -> Any:
    text = (ROOT / "deploy" / "configs" / "demo.toml").read_text()
    spec = parse_job_spec(json.dumps(tomllib.loads(text)), "json")
    return replace(spec, elastic=ElasticSpec(enabled=True, gradient_deadline_s=30.0))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.service.grpc_harness import serving

    spec = demo_spec()
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-elastic-")  # removed when collected
    tmp = Path(tmp_dir.name)
    backend = JobBackend(spec, str(tmp / "model"), 1)
    timeline = Timeline()
    domain = GradientDomain(SystemClock(), timeline)
    trainer = ElasticTrainer(spec, spec.to_json(), backend, tmp, domain, SessionLeases(domain),
                             timeline)
    hybrid = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_elastic", "--hybrid"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    assert hybrid.stdout is not None and hybrid.stdin is not None
    hybrid.stdout.readline()  # "ready": torch imported, idle
    rows: list[dict[str, Any]] = []
    async with serving("trainer", trainer_pb2_grpc.add_GradientChannelServicer_to_server,
                       GradientChannelServicer(trainer), trainer_pb2.DESCRIPTOR,
                       "GradientChannel") as address:
        step, decided_at = 0, None
        while True:
            step += 1
            if step == args.before + 1:
                decided_at = time.perf_counter()
                hybrid.stdin.write(address + "\n")
                hybrid.stdin.flush()
            await trainer.boundary(step - 1, 0)
            phase = _phase(domain, decided_at)
            started = time.perf_counter()
            metrics = await trainer.train(demo_batch(step), step)
            rows.append({"step": step, "phase": phase, "train_s": time.perf_counter() - started,
                         "hybrid_slices": metrics.get("hybrid_slices", 0.0),
                         "ended_at": time.perf_counter()})
            if sum(r["hybrid_slices"] for r in rows) >= args.after:
                break
            await asyncio.sleep(args.wait_s)
        trainer.close("benchmark over")
        await asyncio.sleep(0.2)
    hybrid.wait(timeout=30)
    return _summary(rows, decided_at or 0.0, timeline)


def _phase(domain: GradientDomain, decided_at: float | None) -> str:
    if decided_at is None:
        return "before"
    return "active" if domain.active() else "joining"


def _summary(rows: list[dict[str, Any]], decided_at: float, timeline: Timeline
             ) -> dict[str, Any]:
    by_phase = {p: [r["train_s"] for r in rows if r["phase"] == p]
                for p in ("before", "joining", "active")}
    # The first steps warm the allocator and caches: leave them out of the baseline.
    by_phase["before"] = by_phase["before"][2:]
    med = {p: statistics.median(v) if v else None for p, v in by_phase.items()}
    first = next(r for r in rows if r["hybrid_slices"] >= 1)
    ev = timeline.events
    return {
        "step_s_median": med, "steps": {p: len(v) for p, v in by_phase.items()},
        "joining_vs_before": med["joining"] / med["before"] if med["joining"] else None,
        "active_vs_before": med["active"] / med["before"] if med["active"] else None,
        "move_latency_s": {
            "snapshot_sent": ev.get("hybrid_snapshot_sent", decided_at) - decided_at,
            "activated": ev.get("hybrid_activated", decided_at) - decided_at,
            "first_gradient_merged": first["ended_at"] - decided_at},
    }


def hybrid_main() -> None:
    """The lent worker: idle until told the trainer's address, then join and serve."""
    from libra.clients.gradient import GrpcGradientChannel
    from services.rollout.hybrid_backend import TorchHybridTrainer
    from services.rollout.hybrid_join import HybridJoin

    print("ready", flush=True)
    address = sys.stdin.readline().strip()
    epoch = {"value": 5}

    async def activate() -> int:
        epoch["value"] += 1
        return epoch["value"]

    join = HybridJoin(ch.Hello("bench", "hybrid-0", 5, 1), address, GrpcGradientChannel(),
                      lambda snap: TorchHybridTrainer(snap, 1), activate)
    asyncio.run(join.run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=int, default=12, help="core-only steps first")
    parser.add_argument("--after", type=int, default=8, help="steps with the hybrid merged")
    parser.add_argument("--wait-s", type=float, default=0.15,
                        help="rollout wait between steps (the hybrid catches up then)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--hybrid", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hybrid:
        hybrid_main()
        return
    summary = asyncio.run(run(args))
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    med, steps = summary["step_s_median"], summary["steps"]
    print("core step time (train only), median:")
    for phase in ("before", "joining", "active"):
        value = med[phase]
        shown = f"{value * 1000:7.1f} ms" if value is not None else "      -"
        print(f"  {phase:8s} {shown}  ({steps[phase]} steps)")
    for key in ("joining_vs_before", "active_vs_before"):
        if summary[key] is not None:
            print(f"  {key}: {summary[key]:.3f}x")
    print("move latency from the decision:")
    for key, value in summary["move_latency_s"].items():
        print(f"  {key:22s} {value:6.2f} s")


if __name__ == "__main__":
    main()
