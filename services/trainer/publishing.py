"""What a step leaves on disk and announces: published weight versions (and pruning the
old ones) and checkpoints carrying the step's report (pure: file I/O runs in threads)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from libra import types as t
from libra.clock import Clock
from libra.run_dir import prune_weight_versions, weights_file
from libra.weight_sync import write_manifest
from libra.wire.step_record import step_record_to_dict
from services.trainer import checkpoint

if TYPE_CHECKING:  # the store's type only: no redis at run time
    from services.trainer.store_protocol import TrainerStore

logger = logging.getLogger(__name__)


class SaveBackend(Protocol):
    def save_weights(self, path: str) -> str: ...

    def save_checkpoint(self, directory: str) -> list[str]: ...


class WeightPublisher:
    """Publishes, prunes and checkpoints for one trainer."""

    def __init__(self, store: TrainerStore, clock: Clock,
                 pinned: Callable[[str], set[int]] | None = None) -> None:
        self._store = store
        self._clock = clock
        # Versions the weight service is streaming now (services/trainer/weight_server.py).
        self._pinned = pinned or (lambda _job_id: set())

    async def publish(self, job_id: str, backend: SaveBackend, run_dir: Path, model_dir: str,
                      version: int) -> float:
        """Write and announce a version; returns the seconds it took."""
        started = time.perf_counter()
        path = weights_file(run_dir, version)
        await asyncio.to_thread(backend.save_weights, str(path))
        # The pointer names the chunked manifest and carries the manifest's own sha256.
        manifest, digest = await asyncio.to_thread(write_manifest, path, version)
        await self._store.publish_policy(job_id, t.PolicyInfo(
            version, str(manifest), digest, model_dir, self._clock.now_ms()))
        return round(time.perf_counter() - started, 4)

    async def prune(self, job_id: str, run_dir: Path, keep: int) -> int:
        """Delete published versions beyond the newest ``keep`` that no live rollout
        instance holds or fetches; returns how many went."""
        if keep == 0:
            return 0
        in_use = await self._store.weights_in_use(job_id) | self._pinned(job_id)
        pruned = await asyncio.to_thread(prune_weight_versions, run_dir, keep, in_use)
        if pruned:
            logger.info("[weights] pruned job_id=%s versions=%s kept_in_use=%s", job_id,
                        pruned, sorted(in_use))
        return len(pruned)

    @staticmethod
    async def checkpoint(backend: SaveBackend, run_dir: Path, version: int,
                         record: t.StepRecord, key: str) -> float:
        """Write the checkpoint of ``record.step`` with the step's report (sent again at a
        resume: a stop between this write and the report would lose the record)."""
        started = time.perf_counter()
        report = {"record": step_record_to_dict(record), "key": key}
        ckpt = await asyncio.to_thread(checkpoint.save, run_dir / "checkpoints", record.step,
                                       version, backend.save_checkpoint,
                                       step_report=report)
        logger.info("[checkpoint] step=%d path=%s", record.step, ckpt.path)
        return round(time.perf_counter() - started, 4)
