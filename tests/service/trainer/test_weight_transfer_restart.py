"""A trainer process killed mid-transfer: the fetch fails clearly, and a fetch against
the restarted trainer resumes from the last good chunk.

Real parts: ``python -m services.trainer`` (twice) on a real Redis, killed by pid; the
rollout's fetcher and typed client over gRPC. The trainer's own fault option holds every
stream after 4 chunks, so the kill always lands at the same point of the transfer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from libra import redis_keys as keys
from libra.clients.weights import GrpcWeightClient
from libra.errors import Unavailable
from libra.run_dir import weights_file
from libra.weight_sync import read_verified, write_manifest
from libra_cli.redis_server import EmbeddedRedis, free_ports
from services.rollout.weight_fetcher import WeightFetcher
from tests.service.test_graceful_shutdown import _wait_serving
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
CHUNK_BYTES = 64 * 1024
NUM_CHUNKS = 10
HELD_AFTER = 4


def _start_trainer(redis_url: str, port: int, extra: list[str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.trainer", f"--server.port={port}",
             "--server.metrics-port=-1", "--server.shutdown-grace-s=1",
             f"--redis-url={redis_url}", *extra],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def test_trainer_killed_mid_transfer_then_restarted_resumes(
        redis_server: EmbeddedRedis, redis, tmp_path: Path) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    path = weights_file(run_dir, 1)
    path.parent.mkdir(parents=True)
    data = os.urandom(CHUNK_BYTES * NUM_CHUNKS)
    path.write_bytes(data)
    _, digest = write_manifest(path, 1, chunk_bytes=CHUNK_BYTES)
    await redis.hset(keys.job(job), mapping={"run_dir": str(run_dir)})
    cache = tmp_path / "cache"
    part = cache / job / (path.name + ".part")
    log = tmp_path / "trainer.log"
    first_port, second_port = free_ports(2)

    # 1) The transfer stops after 4 chunks (held by the server); the trainer is killed.
    proc = _start_trainer(redis_server.url, first_port,
                          [f"--weights.fault-hold-after-chunks={HELD_AFTER}"], log)
    client = GrpcWeightClient(f"127.0.0.1:{first_port}", 5.0)
    try:
        _wait_serving(f"127.0.0.1:{first_port}", proc, log)
        fetcher = WeightFetcher(client, cache, max_stream_retries=2, retry_backoff_s=0.01)
        task = asyncio.create_task(fetcher.fetch(job, 1, digest))
        # The .part is preallocated to the full size: count the chunks written instead.
        await wait_until(lambda: fetcher.last.num_chunks_fetched == HELD_AFTER, timeout_s=60)
        assert part.exists()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        with pytest.raises(Unavailable, match=f"resumes from chunk {HELD_AFTER}"):
            await task
    finally:
        await client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (cache / job / path.name).exists()  # no complete-looking copy was left

    # 2) Against the restarted trainer the fetch resumes from chunk 4.
    proc = _start_trainer(redis_server.url, second_port, [], log)
    client = GrpcWeightClient(f"127.0.0.1:{second_port}", 5.0)
    try:
        _wait_serving(f"127.0.0.1:{second_port}", proc, log)
        fetcher = WeightFetcher(client, cache)
        manifest = await fetcher.fetch(job, 1, digest)
    finally:
        await client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert (fetcher.last.resumed_from_chunk, fetcher.last.num_chunks_fetched) == (
        HELD_AFTER, NUM_CHUNKS - HELD_AFTER)
    assert read_verified(manifest, digest) == data
