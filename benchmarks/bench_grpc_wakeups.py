"""What one stream message costs a grpc.aio server and client, under gRPC's own
experiment defaults and under Libra's (``libra.GRPC_EXPERIMENTS_DEFAULT``).

A server process and a client process per setting, both started with that
``GRPC_EXPERIMENTS``: the client writes ``--messages`` small messages on one
client-streaming call, one every ``--gap-ms`` (as a rollout instance's tool-return
reports arrive), and reads both processes' CPU (/proc/PID/stat) and thread wake-ups
(voluntary context switches of every thread) around the writes. Settings alternate
over ``--rounds``; printed per setting: CPU ms and wake-ups per message on each side,
then the ratios Libra's default / gRPC's.

Usage: python benchmarks/bench_grpc_wakeups.py [--messages 2000] [--gap-ms 3]
       [--rounds 3] [--json]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procstat import cpu_s, wakeups  # noqa: E402  (this directory: run as a script)

from libra import GRPC_EXPERIMENTS_DEFAULT  # noqa: E402

METHOD = "/bench.Wakeups/Stream"
# GRPC_EXPERIMENTS per setting; "" keeps gRPC's defaults.
SETTINGS = {"grpc_default": "", "libra_default": GRPC_EXPERIMENTS_DEFAULT}


def _woken(pid: int) -> int:
    return sum(wakeups(pid).values())


async def serve(port_file: Path) -> None:
    import grpc

    async def count(requests, _context):  # noqa: ANN001
        n = 0
        async for _ in requests:
            n += 1
        return str(n).encode()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Wakeups", {"Stream": grpc.stream_unary_rpc_method_handler(count)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    port_file.write_text(str(port))
    await server.wait_for_termination()


async def drive(port: int, server_pid: int, messages: int, gap_s: float) -> dict[str, float]:
    import grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.stream_unary(METHOD)()
    await call.write(b"warm-up")
    await asyncio.sleep(0.5)
    me = os.getpid()
    before = cpu_s(me), _woken(me), cpu_s(server_pid), _woken(server_pid)
    payload = b"x" * 120  # about one tool-return report
    for _ in range(messages):
        await call.write(payload)
        await asyncio.sleep(gap_s)
    after = cpu_s(me), _woken(me), cpu_s(server_pid), _woken(server_pid)
    await call.done_writing()
    await call
    await channel.close()
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return {"client_cpu_ms": 1000 * delta[0] / messages, "client_wakeups": delta[1] / messages,
            "server_cpu_ms": 1000 * delta[2] / messages, "server_wakeups": delta[3] / messages}


def run_setting(experiments: str, messages: int, gap_ms: float, tmp: Path) -> dict[str, float]:
    env = {**os.environ, "GRPC_EXPERIMENTS": experiments, "PYTHONPATH": str(ROOT)}
    port_file = tmp / "port"
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("benchmark server did not start")
            time.sleep(0.05)
        out = subprocess.run(
            [sys.executable, __file__, "--drive", port_file.read_text(), str(server.pid),
             str(messages), str(gap_ms)], env=env, check=True, capture_output=True, text=True)
        return json.loads(out.stdout.splitlines()[-1])
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--drive", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(Path(args.serve)))
        return
    if args.drive:
        port, server_pid, messages, gap_ms = args.drive
        print(json.dumps(asyncio.run(drive(int(port), int(server_pid), int(messages),
                                           float(gap_ms) / 1000))))
        return
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = list(SETTINGS) if i % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                results[name].append(run_setting(SETTINGS[name], args.messages, args.gap_ms,
                                                 Path(tmp)))
                if not args.json:
                    print(f"round {i + 1} {name}: {json.dumps(results[name][-1])}", flush=True)
    means = {name: {k: round(statistics.mean(r[k] for r in runs), 4) for k in runs[0]}
             for name, runs in results.items()}
    ratios = {k: round(means["libra_default"][k] / means["grpc_default"][k], 3)
              for k in means["grpc_default"] if means["grpc_default"][k]}
    summary = {"messages": args.messages, "gap_ms": args.gap_ms, "rounds": args.rounds,
               "settings": SETTINGS, "per_message": means,
               "ratio_libra_over_grpc_default": ratios}
    if args.json:
        print(json.dumps(summary))
        return
    for name, mean in means.items():
        print(f"{name} (GRPC_EXPERIMENTS={SETTINGS[name]!r}): {mean}")
    print(f"ratio libra/grpc default: {ratios}")


if __name__ == "__main__":
    main()
