"""The coordinator's model check adapter: ``libra.models.inspect`` behind ``ModelCheck``.

The only coordinator module that reaches torch/transformers, and only at the first job
with ``model.kind = "hf"``: the import (seconds) happens lazily so the service starts
quickly and jobs with the built-in model never load torch here.
"""

from __future__ import annotations

import logging

from libra.jobspec import JobSpec

logger = logging.getLogger(__name__)


def check_job_model(spec: JobSpec) -> None:
    """Raise InvalidArgument when this machine cannot load and train ``spec``'s model.

    The budget is this machine's memory (GPU when CUDA is visible, else RAM): the
    coordinator runs beside the trainer in the bare-metal stack.
    """
    if spec.model.kind != "hf":
        return
    from libra.models.inspect import validate_model_for_job

    info = validate_model_for_job(spec)
    if info is not None:
        logger.info("[job] model ok path=%s architecture=%s num_params=%d "
                    "training_memory_bytes=%d", info.path, info.architecture,
                    info.num_params, info.training_memory_bytes)
