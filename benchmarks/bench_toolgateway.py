"""Tool gateway benchmark: sandboxed python-tool throughput and a 200-call load check.

Run: ``python benchmarks/bench_toolgateway.py [--calls 100] [--json] [--grpc]``. Measures
(1) calls/s of a trivial ``python`` tool through ``ToolGatewayCore`` (one sandbox process
per call), sequentially and at the concurrency limit, and (2) 200 concurrent calls against
a limit of 8 slots: outcome counts (success / resource exhausted / deadline) and peak RSS.
``--grpc`` instead measures the same trivial call in-process and through a real gRPC
server + ``GrpcToolGatewayClient`` (same core, same run), side by side with the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

# Before grpc is imported: its fork handlers crash sandboxed children (see the gateway's
# __main__).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from libra.errors import LibraError  # noqa: E402
from services.toolgateway.core import ToolCall, ToolGatewayCore, ToolGatewayLimits  # noqa: E402
from services.toolgateway.rewards import RewardRegistry  # noqa: E402
from services.toolgateway.sandbox import SubprocessSandbox  # noqa: E402
from services.toolgateway.tools import PythonTool, ToolRegistry  # noqa: E402


def _core(queue_depth: int) -> ToolGatewayCore:
    tools = ToolRegistry([PythonTool(SubprocessSandbox())])
    limits = ToolGatewayLimits(max_concurrency_per_tool=8, max_queue_depth_per_tool=queue_depth)
    return ToolGatewayCore(tools, RewardRegistry(), limits)


def _call(i: int, code: str = "print(1)", deadline_ms: int = 30_000) -> ToolCall:
    return ToolCall("bench", f"c{i}", "python", {"code": code}, deadline_ms)


async def _throughput(core: ToolGatewayCore, num_calls: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await core.execute(_call(i))

    start_s = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(num_calls)))
    return num_calls / (time.monotonic() - start_s)


async def _load(num_calls: int, queue_depth: int, deadline_ms: int) -> dict[str, object]:
    core = _core(queue_depth)
    code = "import time\ntime.sleep(0.05)\nprint(1)"

    async def one(i: int) -> str:
        try:
            return (await core.execute(_call(i, code, deadline_ms))).status.value
        except LibraError as exc:
            return exc.grpc_status_name

    start_s = time.monotonic()
    outcomes = await asyncio.gather(*(one(i) for i in range(num_calls)))
    return {"num_calls": num_calls, "limit": 8, "queue_depth": queue_depth,
            "deadline_ms": deadline_ms, "wall_s": round(time.monotonic() - start_s, 2),
            "outcomes": dict(collections.Counter(outcomes))}


async def main(args: argparse.Namespace) -> dict[str, object]:
    core = _core(queue_depth=256)
    await core.execute(_call(-1))  # warm-up: probe and first spawn
    results: dict[str, object] = {
        "sequential_calls_per_s": round(await _throughput(core, args.calls, 1), 1),
        "concurrent8_calls_per_s": round(await _throughput(core, args.calls, 8), 1),
        "load_queue64": await _load(200, 64, 30_000),
        "load_queue256_deadline2s": await _load(200, 256, 2_000),
    }
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results["peak_rss_self_mib"] = round(self_kib / 1024, 1)
    results["peak_rss_child_mib"] = round(
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    return results


async def _grpc_throughput(client, num_calls: int, concurrency: int) -> float:  # noqa: ANN001
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            res = await client.execute("bench", f"g{i}", "python", {"code": "print(1)"}, 30_000)
            assert res.output == "1\n", res

    start_s = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(num_calls)))
    return num_calls / (time.monotonic() - start_s)


async def main_grpc(args: argparse.Namespace) -> dict[str, object]:
    """calls/s in-process vs through gRPC, on one core, interleaved in one run."""
    from libra.clients.toolgateway import GrpcToolGatewayClient
    from libra.grpcx import Registration, Server
    from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc
    from libra.service_config import ServerConfig
    from services.toolgateway.servicer import ToolGatewayServicer

    core = _core(queue_depth=256)
    name = toolgateway_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name
    server = Server("toolgateway", ServerConfig(port=0, metrics_port=-1, shutdown_grace_s=1.0),
                    [Registration(toolgateway_pb2_grpc.add_ToolGatewayServiceServicer_to_server,
                                  ToolGatewayServicer(core), name)])
    await server.start()
    client = GrpcToolGatewayClient(f"127.0.0.1:{server.port}", timeout_s=60.0)
    try:
        await core.execute(_call(-1))
        await _grpc_throughput(client, 4, 1)  # warm-up: channel and first spawns
        results: dict[str, object] = {}
        for concurrency in (1, 8):
            local = await _throughput(core, args.calls, concurrency)
            remote = await _grpc_throughput(client, args.calls, concurrency)
            results[f"concurrency{concurrency}"] = {
                "in_process_calls_per_s": round(local, 1), "grpc_calls_per_s": round(remote, 1),
                "grpc_over_in_process": round(remote / local, 3)}
    finally:
        await client.close()
        await server.stop()
    results["calls_per_run"] = args.calls
    results["peak_rss_self_mib"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per throughput run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--grpc", action="store_true",
                        help="compare in-process and gRPC calls/s of a trivial python call")
    cli_args = parser.parse_args()
    out = asyncio.run(main_grpc(cli_args) if cli_args.grpc else main(cli_args))
    if cli_args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
