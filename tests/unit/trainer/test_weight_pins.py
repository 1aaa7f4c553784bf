"""A version the weight service is streaming is never pruned (the publisher asks the
server's pins besides the versions live instances report); over the in-memory store and
a real file layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.clock import SystemClock
from libra.run_dir import published_versions, weights_file
from services.trainer.config import WeightServeConfig
from services.trainer.memory_store import MemoryTrainerStore
from services.trainer.publishing import WeightPublisher
from services.trainer.weight_server import WeightServer

JOB = "job-p"


def _publish(run_dir: Path, versions: range) -> None:
    for version in versions:
        path = weights_file(run_dir, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"w")


async def test_a_version_being_streamed_is_kept(tmp_path: Path) -> None:
    _publish(tmp_path, range(4))
    publisher = WeightPublisher(MemoryTrainerStore(), SystemClock(), lambda job: {1})
    assert await publisher.prune(JOB, tmp_path, keep=1) == 2
    assert sorted(published_versions(tmp_path)) == [1, 3]


async def test_without_pins_only_the_newest_are_kept(tmp_path: Path) -> None:
    _publish(tmp_path, range(4))
    publisher = WeightPublisher(MemoryTrainerStore(), SystemClock())
    await publisher.prune(JOB, tmp_path, keep=1)
    assert sorted(published_versions(tmp_path)) == [3]


def test_a_server_without_stream_slots_is_refused() -> None:
    async def run_dir_of(_job_id: str) -> str:
        return ""

    with pytest.raises(ValueError, match="weights.max_streams must be >= 1"):
        WeightServer(run_dir_of, 0)
    with pytest.raises(ValueError, match="weights.max_streams must be >= 1, got 0"):
        WeightServeConfig(max_streams=0)
