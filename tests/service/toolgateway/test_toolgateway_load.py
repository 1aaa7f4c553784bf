"""200 concurrent python calls over real gRPC against 8 slots and a queue of 64.

The gateway runs as its own process (``python -m services.toolgateway``, the real entry
point, without ``GRPC_ENABLE_FORK_SUPPORT`` in its environment) so its memory is measured
alone and its event loop is not shared with the load generator. Expected: every call
either succeeds or is refused with RESOURCE_EXHAUSTED (nothing else, in particular no
crashed sandbox children), the gateway serves normally afterwards, and its memory stays
bounded (a second burst does not grow it further).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.errors import LibraError, ResourceExhausted
from libra.redis_server import free_ports

ROOT = Path(__file__).resolve().parents[3]
NUM_CALLS, LIMIT, QUEUE = 200, 8, 64
CODE = "import time\ntime.sleep(0.3)\nprint('ok')"
MIB = 1024 * 1024


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


@pytest.fixture
async def gateway_process(tmp_path: Path) -> AsyncIterator[tuple[subprocess.Popen, str]]:
    port = free_ports(1)[0]
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    log = open(tmp_path / "toolgateway.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.toolgateway", f"--server.port={port}",
         "--server.metrics-port=-1", f"--max-concurrency-per-tool={LIMIT}",
         f"--max-queue-depth-per-tool={QUEUE}", "--calculator-transient-failure-rate=0"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        client = GrpcToolGatewayClient(address, timeout_s=2.0, max_attempts=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                await client.list_tools()
                break
            except LibraError:
                assert proc.poll() is None, (tmp_path / "toolgateway.log").read_text()
                assert time.monotonic() < deadline, "gateway did not start within 30 s"
                await asyncio.sleep(0.2)
        await client.close()
        yield proc, address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _burst(client: GrpcToolGatewayClient, prefix: str) -> collections.Counter:
    async def one(i: int) -> str:
        try:
            res = await client.execute("load", f"{prefix}{i}", "python", {"code": CODE}, 30_000)
        except ResourceExhausted:
            return "RESOURCE_EXHAUSTED"
        except Exception as exc:  # noqa: BLE001 - counted and reported by the assertion
            return f"{type(exc).__name__}: {exc}"
        if res.status is t.ToolStatus.SUCCESS and res.output != "ok\n":
            return f"wrong output {res.output!r}"
        return res.status.value + (f": {res.error}" if res.error else "")

    return collections.Counter(await asyncio.gather(*(one(i) for i in range(NUM_CALLS))))


async def test_200_concurrent_calls_against_8_slots(gateway_process):
    proc, address = gateway_process
    client = GrpcToolGatewayClient(address, timeout_s=60.0)
    try:
        warm = await client.execute("load", "warm", "python", {"code": "print(1)"}, 10_000)
        assert warm.status is t.ToolStatus.SUCCESS, warm
        rss_before_kib = _status_kib(proc.pid, "VmRSS")
        start = time.monotonic()
        first = await _burst(client, "a")
        wall_s = time.monotonic() - start
        rss_after_first_kib = _status_kib(proc.pid, "VmRSS")
        second = await _burst(client, "b")
        rss_after_second_kib = _status_kib(proc.pid, "VmRSS")
        peak_kib = _status_kib(proc.pid, "VmHWM")
        print(f"\nload: first={dict(first)} second={dict(second)} wall_first_s={wall_s:.2f} "
              f"gateway rss_before={rss_before_kib // 1024}MiB "
              f"after1={rss_after_first_kib // 1024}MiB after2={rss_after_second_kib // 1024}MiB"
              f" peak(VmHWM)={peak_kib // 1024}MiB")

        for outcomes in (first, second):
            assert set(outcomes) <= {"success", "RESOURCE_EXHAUSTED"}, outcomes
            assert sum(outcomes.values()) == NUM_CALLS
            assert outcomes["success"] >= LIMIT + QUEUE  # every admitted call ran
            assert outcomes["RESOURCE_EXHAUSTED"] > 0  # backpressure, not an unbounded queue
        # Bounded memory: a generous absolute bound, and no growth from burst to burst.
        assert peak_kib * 1024 < 400 * MIB
        assert (rss_after_first_kib - rss_before_kib) * 1024 < 100 * MIB
        assert (rss_after_second_kib - rss_after_first_kib) * 1024 < 32 * MIB

        # Still serving, at full width.
        results = await asyncio.gather(*(client.execute(
            "load", f"after{i}", "python", {"code": "print(6 * 7)"}, 10_000)
            for i in range(LIMIT)))
        assert [r.output for r in results] == ["42\n"] * LIMIT
        assert proc.poll() is None
    finally:
        await client.close()
