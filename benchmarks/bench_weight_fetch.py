"""Weight fetch over gRPC vs a filesystem copy: one published checkpoint to N instances.

A server process serves a published version exactly as the trainer does (the trainer's
``WeightServer`` behind its ``WeightServicer`` on a grpc.aio server; only the Redis
lookup of the run directory is left out). One client process then runs N rollout weight
fetchers at once (each its own channel and cache directory; chunks checked against the
manifest's sha256 as they arrive, ready for the engine to map), and, alternating with
it, two filesystem arms, each N threads at once:

- ``copy``: N ``shutil.copy`` of the file into N directories (an in-kernel copy from
  the page cache that checks nothing): the baseline issue 23 names;
- ``copy_verified``: the same copy, then the check the rollout's loader makes before it
  loads from a filesystem (``read_verified``: the manifest against the pinned sha256,
  every chunk's sha256, the size): the filesystem path as a rollout really uses it.

Printed: seconds per round of each, the medians and the ratios fetch / copy (the
target is <= 2) and fetch / copy_verified, and the CPU seconds per instance's copy on
each side of the wire, user and system apart.

The checkpoint is models/smollm2-135m-instruct/model.safetensors (135M parameters,
float32: 538 MB; ``make smollm2``), published with the trainer's manifest writer.

Usage: python benchmarks/bench_weight_fetch.py [--model DIR] [--instances 8]
       [--rounds 3] [--max-streams 4] [--chunk-bytes 1048576] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procstat import cpu_split_s  # noqa: E402  (this directory: run as a script)

from libra.allocator import keep_freed_buffers  # noqa: E402
from libra.run_dir import weights_file  # noqa: E402
from libra.weight_sync import (  # noqa: E402
    CHUNK_BYTES,
    MANIFEST_SUFFIX,
    read_verified,
    write_manifest,
)

JOB = "bench-job"
VERSION = 1
ARMS = ("fetch", "copy", "copy_verified")


def publish(model_dir: Path, run_dir: Path, chunk_bytes: int) -> tuple[Path, str]:
    """The model's weights as published version 1 of ``run_dir`` (hard link or copy)."""
    path = weights_file(run_dir, VERSION)
    path.parent.mkdir(parents=True, exist_ok=True)
    source = model_dir / "model.safetensors"
    try:
        path.hardlink_to(source)
    except OSError:
        shutil.copy(source, path)
    _, digest = write_manifest(path, VERSION, chunk_bytes)
    return path, digest


async def serve(run_dir: Path, max_streams: int) -> None:
    """The server process: print the port, serve until killed (by pid, by the parent)."""
    from libra.grpcx import Registration, Server
    from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
    from libra.service_config import ServerConfig
    from services.trainer.weight_server import WeightServer
    from services.trainer.weight_servicer import WeightServicer

    async def run_dir_of(_job_id: str) -> str:
        return str(run_dir)

    name = trainer_pb2.DESCRIPTOR.services_by_name["WeightService"].full_name
    server = Server("trainer", ServerConfig(metrics_port=-1), [Registration(
        trainer_pb2_grpc.add_WeightServiceServicer_to_server,
        WeightServicer(WeightServer(run_dir_of, max_streams)), name)])
    await server.start()
    print(server.port, flush=True)
    await asyncio.Event().wait()


async def fetch_round(address: str, digest: str, work: Path, instances: int) -> float:
    """N fetchers at once; seconds until the last has its verified copy ready for the
    engine, as the loader takes it (the path, checked for size: the engine maps it)."""
    from libra.clients.weights import GrpcWeightClient
    from services.rollout.weight_fetcher import WeightFetcher, verified_weights

    clients = [GrpcWeightClient(address, 30.0) for _ in range(instances)]
    fetchers = [WeightFetcher(c, work / f"fetch-{i}") for i, c in enumerate(clients)]
    started = time.perf_counter()
    async def fetch_and_load(fetcher: WeightFetcher) -> int:
        # What the rollout's loader does with a fresh copy (verified on arrival).
        fetched = await fetcher.fetch_version(JOB, VERSION, digest)
        return (await asyncio.to_thread(verified_weights, fetched)).stat().st_size

    await asyncio.gather(*(fetch_and_load(f) for f in fetchers))
    seconds = time.perf_counter() - started
    for client in clients:
        await client.close()
    return seconds


def copy_round(path: Path, digest: str, work: Path, instances: int, verify: bool) -> float:
    """N concurrent shutil.copy of the file (with ``verify``, each copy then checked as
    the loader checks a filesystem path); seconds until the last is done."""
    targets = [work / f"copy-{i}" for i in range(instances)]
    for target in targets:
        target.mkdir(parents=True)
    manifest = path.with_name(path.name + MANIFEST_SUFFIX)

    def copy(target: Path) -> None:
        shutil.copy(path, target)
        if verify:
            shutil.copy(manifest, target)
            read_verified(target / manifest.name, digest)

    started = time.perf_counter()
    with ThreadPoolExecutor(instances) as pool:
        list(pool.map(copy, targets))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path,
                        default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-streams", type=int, default=4,
                        help="the trainer's weights.max_streams")
    parser.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES,
                        help="chunk size of the published manifest (one gRPC message each)")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="leave glibc's malloc thresholds as they are in both processes "
                             "(the services set them: libra/allocator.py)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if not args.glibc_defaults:  # as the trainer's and the rollout's __main__ do
        keep_freed_buffers()
    if args.serve:
        asyncio.run(serve(args.serve, args.max_streams))
        return
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        print(json.dumps(run(args, Path(tmp))) if args.json else report(run(args, Path(tmp))))


def run(args: argparse.Namespace, tmp: Path) -> dict:
    path, digest = publish(args.model, tmp / "run", args.chunk_bytes)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(tmp / "run"),
                               "--max-streams", str(args.max_streams)]
                              + ["--glibc-defaults"] * args.glibc_defaults,
                              stdout=subprocess.PIPE, text=True)
    wall_s: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpu: dict[str, list[tuple[float, ...]]] = {arm: [] for arm in ARMS}
    loads = []
    try:
        address = f"127.0.0.1:{int(server.stdout.readline())}"
        for index in range(args.rounds):
            # Rotate which goes first, so no arm always meets a warmer page cache.
            for arm in ARMS[index % 3:] + ARMS[:index % 3]:
                work = tmp / f"{arm}-{index}"
                before = cpu_split_s(os.getpid()) + cpu_split_s(server.pid)
                if arm == "fetch":
                    seconds = asyncio.run(fetch_round(address, digest, work, args.instances))
                else:
                    seconds = copy_round(path, digest, work, args.instances,
                                         verify=arm == "copy_verified")
                after = cpu_split_s(os.getpid()) + cpu_split_s(server.pid)
                wall_s[arm].append(seconds)
                # Per instance's copy: rollout user, sys; trainer user, sys.
                cpu[arm].append(tuple((b - a) / args.instances
                                      for a, b in zip(before, after, strict=True)))
                loads.append(os.getloadavg()[0])
                shutil.rmtree(work)
    finally:
        server.kill()
        server.wait()
    return summary(args, path.stat().st_size, wall_s, cpu, loads)


def summary(args: argparse.Namespace, size_bytes: int, wall_s: dict[str, list[float]],
            cpu: dict[str, list[tuple[float, ...]]], loads: list[float]) -> dict:
    med = {arm: statistics.median(wall_s[arm]) for arm in ARMS}
    fetch_cpu = cpu["fetch"]
    return {"size_bytes": size_bytes, "instances": args.instances,
            "glibc_defaults": args.glibc_defaults,
            "max_streams": args.max_streams, "chunk_bytes": args.chunk_bytes,
            "fetch_s": [round(s, 3) for s in wall_s["fetch"]],
            "copy_s": [round(s, 3) for s in wall_s["copy"]],
            "copy_verified_s": [round(s, 3) for s in wall_s["copy_verified"]],
            "fetch_median_s": round(med["fetch"], 3), "copy_median_s": round(med["copy"], 3),
            "copy_verified_median_s": round(med["copy_verified"], 3),
            "ratio": round(med["fetch"] / med["copy"], 2),
            "ratio_verified": round(med["fetch"] / med["copy_verified"], 2),
            # CPU seconds per instance's copy of the file: what one rollout / the trainer
            # pays, whatever else shares the cores.
            "rollout_cpu_s_per_copy": [round(c[0] + c[1], 2) for c in fetch_cpu],
            "trainer_cpu_s_per_copy": [round(c[2] + c[3], 2) for c in fetch_cpu],
            "rollout_user_sys_s": [[round(c[0], 2), round(c[1], 2)] for c in fetch_cpu],
            "trainer_user_sys_s": [[round(c[2], 2), round(c[3], 2)] for c in fetch_cpu],
            "copy_cpu_s_per_copy": [round(c[0] + c[1], 2) for c in cpu["copy"]],
            "copy_verified_cpu_s_per_copy": [round(c[0] + c[1], 2)
                                             for c in cpu["copy_verified"]],
            "loadavg_1m": [round(load, 1) for load in loads]}


def report(result: dict) -> str:
    return "\n".join([
        f"checkpoint {result['size_bytes'] / 1e6:.0f} MB to {result['instances']} instances "
        f"(trainer max_streams={result['max_streams']}, chunks {result['chunk_bytes']} B, "
        f"glibc malloc defaults: {result['glibc_defaults']})",
        f"gRPC fetch (verified) s per round:   {result['fetch_s']}",
        f"filesystem copy s per round:         {result['copy_s']}",
        f"filesystem copy + verify s per round: {result['copy_verified_s']}",
        f"CPU s per instance's copy: fetch rollout {result['rollout_cpu_s_per_copy']} "
        f"(user/sys {result['rollout_user_sys_s']}), trainer "
        f"{result['trainer_cpu_s_per_copy']} (user/sys {result['trainer_user_sys_s']}); "
        f"copy {result['copy_cpu_s_per_copy']}; copy + verify "
        f"{result['copy_verified_cpu_s_per_copy']}",
        f"load average {result['loadavg_1m']}",
        f"median fetch {result['fetch_median_s']} s / copy {result['copy_median_s']} s "
        f"= {result['ratio']}x (target <= 2x); / copy + verify "
        f"{result['copy_verified_median_s']} s = {result['ratio_verified']}x"])


if __name__ == "__main__":
    main()
