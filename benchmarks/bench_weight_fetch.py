"""Weight fetch over gRPC vs a filesystem copy: one published checkpoint to N instances.

A server process serves a published version exactly as the trainer does (the trainer's
``WeightServer`` behind its ``WeightServicer`` on a grpc.aio server; only the Redis
lookup of the run directory is left out). One client process then runs N rollout weight
fetchers at once (each its own channel and cache directory; chunks checked against the
manifest's sha256 and the whole file at the end), and, alternating with it, N
``shutil.copy`` of the same file into N directories (N threads: what a rollout with a
shared filesystem would copy, unverified). Printed: seconds per round of each, the
medians and their ratio (fetch / copy; the target is <= 2).

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

from procstat import cpu_s  # noqa: E402  (this directory: run as a script)

from libra.run_dir import weights_file  # noqa: E402
from libra.weight_sync import CHUNK_BYTES, write_manifest  # noqa: E402

JOB = "bench-job"
VERSION = 1


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
    """N fetchers at once; seconds until the last has read its verified copy
    as the loader does."""
    from libra.clients.weights import GrpcWeightClient
    from services.rollout.weight_fetcher import WeightFetcher, read_fetched

    clients = [GrpcWeightClient(address, 30.0) for _ in range(instances)]
    fetchers = [WeightFetcher(c, work / f"fetch-{i}") for i, c in enumerate(clients)]
    started = time.perf_counter()
    async def fetch_and_load(fetcher: WeightFetcher) -> int:
        # What the rollout's loader does with a fresh copy: read it, verified on arrival.
        fetched = await fetcher.fetch_version(JOB, VERSION, digest)
        return len(await asyncio.to_thread(read_fetched, fetched))

    await asyncio.gather(*(fetch_and_load(f) for f in fetchers))
    seconds = time.perf_counter() - started
    for client in clients:
        await client.close()
    return seconds


def copy_round(path: Path, work: Path, instances: int) -> float:
    """N concurrent shutil.copy of the file; seconds until the last is written."""
    targets = [work / f"copy-{i}" for i in range(instances)]
    for target in targets:
        target.mkdir(parents=True)
    started = time.perf_counter()
    with ThreadPoolExecutor(instances) as pool:
        list(pool.map(lambda target: shutil.copy(path, target), targets))
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
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.max_streams))
        return
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        print(json.dumps(run(args, Path(tmp))) if args.json else report(run(args, Path(tmp))))


def run(args: argparse.Namespace, tmp: Path) -> dict:
    path, digest = publish(args.model, tmp / "run", args.chunk_bytes)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(tmp / "run"),
                               "--max-streams", str(args.max_streams)],
                              stdout=subprocess.PIPE, text=True)
    try:
        address = f"127.0.0.1:{int(server.stdout.readline())}"
        fetch_s, copy_s, fetch_cpu_s, copy_cpu_s = [], [], [], []
        client_cpu_s, server_cpu_s, loads = [], [], []
        for index in range(args.rounds):
            # Alternate which goes first, so neither always meets a warmer page cache.
            order = ("fetch", "copy") if index % 2 == 0 else ("copy", "fetch")
            for kind in order:
                work = tmp / f"{kind}-{index}"
                client_before, server_before = cpu_s(os.getpid()), cpu_s(server.pid)
                if kind == "fetch":
                    fetch_s.append(asyncio.run(fetch_round(address, digest, work,
                                                           args.instances)))
                else:
                    copy_s.append(copy_round(path, work, args.instances))
                client_cpu = cpu_s(os.getpid()) - client_before
                server_cpu = cpu_s(server.pid) - server_before
                (fetch_cpu_s if kind == "fetch" else copy_cpu_s).append(client_cpu + server_cpu)
                if kind == "fetch":  # per instance: what one rollout / the trainer pays
                    client_cpu_s.append(client_cpu / args.instances)
                    server_cpu_s.append(server_cpu / args.instances)
                loads.append(os.getloadavg()[0])
                shutil.rmtree(work)
    finally:
        server.kill()
        server.wait()
    fetch_med, copy_med = statistics.median(fetch_s), statistics.median(copy_s)
    return {"size_bytes": path.stat().st_size, "instances": args.instances,
            "max_streams": args.max_streams, "chunk_bytes": args.chunk_bytes,
            "fetch_s": [round(s, 3) for s in fetch_s],
            "copy_s": [round(s, 3) for s in copy_s], "fetch_median_s": round(fetch_med, 3),
            "copy_median_s": round(copy_med, 3), "ratio": round(fetch_med / copy_med, 2),
            # CPU seconds of both processes (client + server) per round: what the work
            # costs whatever else shares the cores.
            "fetch_cpu_s": [round(s, 2) for s in fetch_cpu_s],
            "copy_cpu_s": [round(s, 2) for s in copy_cpu_s],
            # CPU seconds per instance's copy of the file, on each side of the wire.
            "rollout_cpu_s_per_copy": [round(s, 2) for s in client_cpu_s],
            "trainer_cpu_s_per_copy": [round(s, 2) for s in server_cpu_s],
            "loadavg_1m": [round(load, 1) for load in loads]}


def report(result: dict) -> str:
    return "\n".join([
        f"checkpoint {result['size_bytes'] / 1e6:.0f} MB to {result['instances']} instances "
        f"(trainer max_streams={result['max_streams']})",
        f"gRPC fetch (verified) s per round: {result['fetch_s']}",
        f"filesystem copy s per round:     {result['copy_s']}",
        f"CPU s (client + server) per round: fetch {result['fetch_cpu_s']} "
        f"copy {result['copy_cpu_s']} (load average {result['loadavg_1m']})",
        f"CPU s per instance's copy: rollout {result['rollout_cpu_s_per_copy']} "
        f"trainer {result['trainer_cpu_s_per_copy']}",
        f"median fetch {result['fetch_median_s']} s / copy {result['copy_median_s']} s "
        f"= {result['ratio']}x (target <= 2x)"])


if __name__ == "__main__":
    main()
