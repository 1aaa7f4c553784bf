"""200 concurrent python calls over real gRPC against 8 slots and a queue of 64.

The gateway runs as its own process (``python -m services.toolgateway``, the real entry
point, without ``GRPC_ENABLE_FORK_SUPPORT`` in its environment) so its memory is measured
alone and its event loop is not shared with the load generator.

No outcome depends on how fast the machine is (the suite shares two cores with other
work): the backpressure burst is made of calls that would run for minutes, so none
finishes while the burst arrives, however slowly it arrives - exactly 8 run, 64 wait and
the other 128 are refused; then the held calls are cancelled (their sandboxes are
killed). A second burst of exactly 8 + 64 short calls fits the slots and the queue, so
every one of them must run and succeed. Afterwards the gateway serves at full width and
its memory stays bounded.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra import types as t
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.errors import LibraError, ResourceExhausted
from libra_cli.redis_server import free_ports

ROOT = Path(__file__).resolve().parents[3]
NUM_CALLS, LIMIT, QUEUE = 200, 8, 64
CODE = "import time\ntime.sleep(0.3)\nprint('ok')"
HOLD_CODE = "import time\ntime.sleep(3600)"
HOLD_S = 600.0  # python calls' time limit in this gateway: far beyond any burst's arrival
MIB = 1024 * 1024


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (sandboxed python processes), from /proc."""
    pids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


async def _until_no_children(pid: int, timeout_s: float = 60.0) -> list[int]:
    """Poll until the cancelled calls' processes are reaped (bounded; the kill is async)."""
    deadline = time.monotonic() + timeout_s
    while (children := _child_pids(pid)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return children


def _lane(metrics_port: int, tool: str = "python") -> tuple[int, int]:
    """(running, waiting) calls of ``tool``, from the gateway's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    values = {}
    for line in text.decode().splitlines():
        for name in ("libra_tool_calls_running", "libra_tool_calls_waiting"):
            if line.startswith(f'{name}{{tool="{tool}"}}'):
                values[name] = int(float(line.split()[-1]))
    return values["libra_tool_calls_running"], values["libra_tool_calls_waiting"]


async def _until_lane_empty(metrics_port: int, timeout_s: float = 60.0) -> tuple[int, int]:
    """Poll until the cancelled calls left the python lane (the server learns of a
    client's cancel asynchronously); bounded."""
    deadline = time.monotonic() + timeout_s
    while (lane := _lane(metrics_port)) != (0, 0) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return lane


@pytest.fixture
async def gateway_process(tmp_path: Path) -> AsyncIterator[tuple[subprocess.Popen, str, int]]:
    port, metrics_port = free_ports(2)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    log = open(tmp_path / "toolgateway.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.toolgateway", f"--server.port={port}",
         f"--server.metrics-port={metrics_port}", f"--max-concurrency-per-tool={LIMIT}",
         f"--max-queue-depth-per-tool={QUEUE}", "--calculator-transient-failure-rate=0",
         f"--python-timeout-s={HOLD_S}"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        client = GrpcToolGatewayClient(address, timeout_s=2.0, max_attempts=1)
        deadline = time.monotonic() + 120  # a cold start on a loaded machine
        while True:
            try:
                await client.list_tools()
                break
            except LibraError:
                assert proc.poll() is None, (tmp_path / "toolgateway.log").read_text()
                assert time.monotonic() < deadline, "gateway did not start within 120 s"
                await asyncio.sleep(0.2)
        await client.close()
        yield proc, address, metrics_port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def _outcome(call) -> str:
    try:
        res = await call
    except ResourceExhausted:
        return "RESOURCE_EXHAUSTED"
    except Exception as exc:  # noqa: BLE001 - counted and reported by the assertion
        return f"{type(exc).__name__}: {exc}"
    if res.status is t.ToolStatus.SUCCESS and res.output != "ok\n":
        return f"wrong output {res.output!r}"
    return res.status.value + (f": {res.error}" if res.error else "")


async def _held_burst(client: GrpcToolGatewayClient, metrics_port: int) -> collections.Counter:
    """NUM_CALLS calls that never finish by themselves: count the refusals, then cancel
    the admitted ones (running or queued) and check they were still pending."""
    deadline_ms = int(HOLD_S * 1000)
    tasks = [asyncio.create_task(_outcome(client.execute(
        "load", f"hold{i}", "python", {"code": HOLD_CODE}, deadline_ms)))
        for i in range(NUM_CALLS)]
    refused = NUM_CALLS - LIMIT - QUEUE
    outcomes: collections.Counter = collections.Counter()
    pending = set(tasks)
    while sum(outcomes.values()) < refused:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        outcomes.update(task.result() for task in done)
    outcomes["admitted_and_pending"] = len(pending)
    # The gateway's own view while they are held: every slot taken, the queue full.
    outcomes["lane_running"], outcomes["lane_waiting"] = _lane(metrics_port)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return outcomes


async def _fitting_burst(client: GrpcToolGatewayClient) -> collections.Counter:
    """Exactly as many short calls as slots + queue: all are admitted and must run."""
    return collections.Counter(await asyncio.gather(*(_outcome(client.execute(
        "load", f"fit{i}", "python", {"code": CODE}, 60_000)) for i in range(LIMIT + QUEUE))))


async def test_200_concurrent_calls_against_8_slots(gateway_process):
    proc, address, metrics_port = gateway_process
    client = GrpcToolGatewayClient(address, timeout_s=HOLD_S)
    try:
        warm = await client.execute("load", "warm", "python", {"code": "print(1)"}, 10_000)
        assert warm.status is t.ToolStatus.SUCCESS, warm
        rss_before_kib = _status_kib(proc.pid, "VmRSS")
        start = time.monotonic()
        held = await _held_burst(client, metrics_port)
        wall_s = time.monotonic() - start
        assert await _until_lane_empty(metrics_port) == (0, 0)
        rss_after_first_kib = _status_kib(proc.pid, "VmRSS")
        fitting = await _fitting_burst(client)
        rss_after_second_kib = _status_kib(proc.pid, "VmRSS")
        peak_kib = _status_kib(proc.pid, "VmHWM")
        print(f"\nload: held={dict(held)} fitting={dict(fitting)} wall_held_s={wall_s:.2f} "
              f"gateway rss_before={rss_before_kib // 1024}MiB "
              f"after1={rss_after_first_kib // 1024}MiB after2={rss_after_second_kib // 1024}MiB"
              f" peak(VmHWM)={peak_kib // 1024}MiB")

        # Backpressure, not an unbounded queue: 8 running + 64 waiting, the rest refused.
        assert held == {"RESOURCE_EXHAUSTED": NUM_CALLS - LIMIT - QUEUE,
                        "admitted_and_pending": LIMIT + QUEUE,
                        "lane_running": LIMIT, "lane_waiting": QUEUE}, held
        # The cancelled calls gave their slots back and left no process; every admitted
        # call runs.
        assert fitting == {"success": LIMIT + QUEUE}, fitting
        assert await _until_no_children(proc.pid) == []
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
