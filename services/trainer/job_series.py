"""Removing the trainer's series of deleted jobs (eval score and round, staleness).

The coordinator does the same for its ``libra_job_*`` series
(services/coordinator/step_metrics.py). A job is gone once its record left Redis, or
once it ended and its run folder was deleted (``libra gc`` or the coordinator's
retention); a running or queued job keeps its series.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

from libra import metrics
from libra import types as t
from libra.cancellation import raise_if_cancelled

logger = logging.getLogger(__name__)
SERIES_PRUNE_INTERVAL_S = 60.0
"""As the coordinator's: a `libra gc` shows within a minute; a pass is a field read per
exported job (a trainer exports a handful)."""


class _JobFields(Protocol):
    async def job_field(self, job_id: str, name: str) -> str | None: ...


async def job_is_gone(store: _JobFields, job_id: str) -> bool:
    """Deleted from the store, or ended with its run folder deleted."""
    state = await store.job_field(job_id, "state")
    if state is None:
        return True
    run_dir = await store.job_field(job_id, "run_dir")
    ended = state in {s.value for s in t.JobState if s.is_terminal}
    return ended and not (run_dir and Path(run_dir).exists())


async def run_series_pruning(store: _JobFields,
                             interval_s: float = SERIES_PRUNE_INTERVAL_S) -> None:
    """Forever: sleep, then drop the series of gone jobs (cancelled at shutdown)."""
    while True:
        raise_if_cancelled()
        await asyncio.sleep(interval_s)
        try:
            for job_id in await metrics.prune_jobs(lambda j: job_is_gone(store, j)):
                logger.info("[metrics] series removed job_id=%s (job deleted)", job_id)
        except Exception:  # noqa: BLE001 - the next pass retries; the service stays up
            logger.warning("[metrics] series pruning failed; next in %.0f s", interval_s,
                           exc_info=True)
