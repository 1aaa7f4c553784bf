"""Torch adapter of a lent rollout worker: the core's training state, in lockstep.

Built from the core's snapshot (the job spec travels with it), it applies the core's
merged updates and computes gradients of the slices it is given, with the same code as
the trainer (``JobBackend``), so its weights stay bitwise equal to the core's. On GPUs
the inference engine would be put to sleep first to free its memory; on CPU both fit.
"""

from __future__ import annotations

from libra.jobspec import job_spec_from_json
from libra.training import channel as ch
from libra.training.samples import TrainSample


class TorchHybridTrainer:
    def __init__(self, snapshot: ch.Snapshot, num_threads: int) -> None:
        # torch loads when a worker is lent, not at the rollout service's start.
        from libra.training.backend import JobBackend

        spec = job_spec_from_json(snapshot.spec_json)
        self._backend = JobBackend(spec, "", num_threads, write_model_dir=False)
        self._backend.load_checkpoint(snapshot.directory)
        self.lockstep_check_interval = spec.elastic.lockstep_check_interval

    def apply_update(self, data: bytes, lr: float) -> float:
        return self._backend.apply_update(data, lr)

    def slice_gradient(self, samples: list[TrainSample], scale: float
                       ) -> tuple[bytes, dict[str, float], bool]:
        return self._backend.slice_gradient(samples, scale)

    def checksum(self) -> str:
        return self._backend.checksum()
