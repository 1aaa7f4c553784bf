"""The weight-service tests' rig: a published version and model directory as the trainer
writes them, served by a real WeightServer (the ``serve`` fixture is in conftest.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from libra.clients.weights import GrpcWeightClient
from libra.run_dir import weights_file
from libra.weight_sync import write_manifest
from services.rollout.weight_fetcher import WeightFetcher
from services.trainer.weight_server import WeightFaults, WeightServer

JOB = "job-w"
CHUNK_BYTES = 64 * 1024
NUM_CHUNKS = 10


def publish(run_dir: Path, version: int) -> tuple[bytes, str]:
    """A published version of NUM_CHUNKS chunks, as the trainer writes it; returns the
    weights bytes and the manifest's sha256 (what the Redis pointer carries)."""
    path = weights_file(run_dir, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = os.urandom(CHUNK_BYTES * NUM_CHUNKS - 123)  # a short last chunk
    path.write_bytes(data)
    _, digest = write_manifest(path, version, chunk_bytes=CHUNK_BYTES)
    return data, digest


class Trainer:
    """A WeightServer over one run directory, served on a loopback port."""

    def __init__(self, tmp: Path, max_streams: int = 4, faults: WeightFaults | None = None):
        self.run_dir = tmp / "run"
        self.data, self.digest = publish(self.run_dir, 1)
        self.model_files = {"config.json": b'{"model_type": "llama"}',
                            "model.safetensors": os.urandom(5 * (1 << 19) + 7)}  # 3 chunks
        (self.run_dir / "model").mkdir()
        for name, body in self.model_files.items():
            (self.run_dir / "model" / name).write_bytes(body)
        self.server = WeightServer(self._run_dir_of, max_streams, faults)
        self.address = ""

    async def _run_dir_of(self, job_id: str) -> str:
        if job_id != JOB:
            raise RuntimeError(f"job {job_id} has no run_dir")
        return str(self.run_dir)


def fetcher(client: GrpcWeightClient, tmp: Path) -> WeightFetcher:
    return WeightFetcher(client, tmp / "cache", max_stream_retries=2, retry_backoff_s=0.01)


async def first_chunk(stream: AsyncIterator) -> int:
    return (await anext(stream)).index
