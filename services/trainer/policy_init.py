"""A job's first policy: the warm start (after ``init_from``'s weights), or the newest
checkpoint on a resume, and the first version number to publish (pure: file I/O and the
backend run in threads)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from libra.jobspec import JobSpec
from libra.run_dir import resolve_init_from
from libra.wire.step_record import step_record_from_dict
from services.trainer import checkpoint
from services.trainer.reports import CoordinatorReporter

if TYPE_CHECKING:  # the store's type only: no redis at run time
    from services.trainer.store_protocol import TrainerStore

logger = logging.getLogger(__name__)


class InitBackend(Protocol):
    def warm_start(self, should_stop: Callable[[], bool] = ...) -> dict[str, float]: ...

    def load_checkpoint(self, directory: str) -> None: ...

    def load_model_weights(self, checkpoint_dir: str) -> None: ...


class PolicyInitializer:
    """Brings a job's backend to its starting policy; ``should_stop`` ends a warm start,
    ``set_step`` tells the trainer the checkpoint's step as soon as it is loaded (its
    status shows it while the checkpoint's step report is retried)."""

    def __init__(self, store: TrainerStore, reports: CoordinatorReporter,
                 should_stop: Callable[[], bool], set_step: Callable[[int], None]) -> None:
        self._store = store
        self._reports = reports
        self._should_stop = should_stop
        self._set_step = set_step

    async def init(self, job_id: str, spec: JobSpec, backend: InitBackend, run_dir: Path,
                   resume: bool) -> tuple[int, int]:
        """Warm start (after ``init_from``'s weights), or load the newest checkpoint;
        returns (the step to continue from, the version to publish)."""
        ckpt = None
        step = 0
        if resume:
            ckpt = await asyncio.to_thread(checkpoint.latest, run_dir / "checkpoints")
        if ckpt is None:
            await self._load_init_from(job_id, spec, backend, run_dir)
            warm = await asyncio.to_thread(backend.warm_start, self._should_stop)
            logger.info("[warmup] done job_id=%s %s", job_id, warm)
        else:
            await asyncio.to_thread(backend.load_checkpoint, str(ckpt.path))
            step = ckpt.step
            self._set_step(step)
            logger.info("[resume] from checkpoint job_id=%s step=%d path=%s", job_id,
                        ckpt.step, ckpt.path)
            if ckpt.step_report is not None:  # a repeat if it was delivered (same key)
                await self._reports.report_step(
                    job_id, step_record_from_dict(ckpt.step_report["record"]),
                    ckpt.step_report["key"])
        if not resume:
            return step, 0
        # Never reuse a version number: rollout instances load only newer versions.
        last = await self._store.policy_version(job_id)
        await self._store.record_event(job_id, "trainer_resumed", step=str(step),
                                       checkpoint=str(ckpt.path) if ckpt else "")
        return step, max(last, ckpt.policy_version if ckpt else -1) + 1

    async def _load_init_from(self, job_id: str, spec: JobSpec, backend: InitBackend,
                              run_dir: Path) -> None:
        """``algorithm.init_from``: another job's model weights, nothing else (fresh
        optimizer, step 0). Resolved now, not at submit: a job id gives that job's
        newest checkpoint at this start. Job run dirs share the run root."""
        if not spec.algorithm.init_from:
            return
        ckpt = await asyncio.to_thread(resolve_init_from, spec.algorithm.init_from,
                                       run_dir.parent)
        await asyncio.to_thread(backend.load_model_weights, str(ckpt.path))
        logger.info("[init_from] job_id=%s checkpoint=%s step=%d", job_id, ckpt.path, ckpt.step)
        await self._store.record_event(job_id, "init_from", checkpoint=str(ckpt.path),
                                       step=str(ckpt.step))
