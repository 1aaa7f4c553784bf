"""The coordinator's ``algorithm.init_from`` check adapter: ``libra.models.init_check``
behind ``InitFromCheck``.

Resolves the job id or directory to a checkpoint, verifies its files and compares its
tensor names and shapes with the job's ``[model]`` (safetensors header and a meta-device
model: nothing is loaded). torch/transformers are imported on the first job with
``init_from`` only.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from libra.jobspec import JobSpec

logger = logging.getLogger(__name__)


def check_job_init_from(spec: JobSpec, run_root: Path) -> None:
    """Raise InvalidArgument("algorithm.init_from", ...) when the job cannot start from
    the checkpoint it names; nothing to check without ``init_from``."""
    if not spec.algorithm.init_from:
        return
    # Lazily: the libra.models package imports torch (seconds); the coordinator must
    # start without it.
    from libra.models.init_check import check_init_from

    started = time.perf_counter()
    ckpt = check_init_from(spec, run_root)
    logger.info("[job] init_from ok checkpoint=%s step=%d check_s=%.2f", ckpt.path, ckpt.step,
                time.perf_counter() - started)
