"""The coordinator's dataset check adapter: ``libra.data.check_job_dataset`` behind
``DatasetCheck``.

A file dataset is opened (converted to Arrow in the ``datasets`` cache on first use,
which the scheduler and trainer then reuse) and validated before the job is stored;
``datasets`` is imported on the first file dataset only. Built-in tasks cost
milliseconds.
"""

from __future__ import annotations

import logging
import time

from libra.data import check_job_dataset
from libra.jobspec import JobSpec

logger = logging.getLogger(__name__)


def check_dataset(spec: JobSpec) -> None:
    """Raise InvalidArgument when ``spec``'s dataset cannot feed the job."""
    started = time.perf_counter()
    summary = check_job_dataset(spec)
    logger.info("[job] dataset ok kind=%s train_rows=%d eval_rows=%d check_s=%.2f",
                summary.kind, summary.num_train_rows, summary.num_eval_rows,
                time.perf_counter() - started)
