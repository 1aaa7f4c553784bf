"""What the trainer core needs of a training engine (``Backend``) and of what builds one per
job (``BackendFactory``); torch implements them (``libra.training``, ``distributed.py``).

Apart from ``core.py`` so the adapters and the fakes type against them without the core's
loop, and the core drives a backend without importing torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from libra.jobspec import JobSpec
from libra.training.samples import TrainSample


class Backend(Protocol):
    """The training engine of one job (torch: ``libra.training``); the core drives it
    without importing torch, so tests can pass a small fake."""

    def warm_start(self, should_stop: Callable[[], bool] = ...) -> dict[str, float]:
        """Supervised steps on the demonstrations before GRPO; ``should_stop`` ends it early."""
        ...

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One GRPO step on a complete batch of groups; returns the step's metrics."""
        ...

    def save_weights(self, path: str) -> str:
        """Write the policy weights to ``path`` (what rollouts load); returns their sha256."""
        ...

    def save_checkpoint(self, directory: str) -> list[str]:
        """Write model, optimizer and RNG state (what a resume needs); returns the files."""
        ...

    def load_checkpoint(self, directory: str) -> None:
        """Restore the state ``save_checkpoint`` wrote (a resumed job)."""
        ...

    def load_model_weights(self, checkpoint_dir: str) -> None:
        """``init_from``: only a checkpoint's model weights (optimizer, RNG, step fresh)."""
        ...


class BackendFactory(Protocol):
    """Builds the backend for one job, so a job's model and settings choose it."""

    def create(self, spec: JobSpec, model_dir: str) -> Backend:
        """The backend for ``spec``, its model loaded from ``model_dir``."""
        ...
