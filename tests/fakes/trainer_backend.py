"""Fake trainer backend and factory (``Backend``, ``BackendFactory`` of
services/trainer/backend_protocol.py).

Replaces: the torch model, optimizer and safetensors writer of the trainer. Everything
else is real. ``train_step`` records the samples and returns fixed metrics (or raises
``fail_with``); ``save_weights`` writes a small file and returns its real sha256;
``save_checkpoint`` writes the step count, ``load_checkpoint`` reads it back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from libra.jobspec import JobSpec
from libra.training.samples import TrainSample


@dataclass
class FakeBackend:
    fail_with: Exception | None = None
    warm_started: int = 0
    steps: list[list[TrainSample]] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=lambda: {"loss": 0.25, "kl": 0.0})
    loaded_checkpoints: list[str] = field(default_factory=list)
    loaded_model_weights: list[str] = field(default_factory=list)

    def warm_start(self, should_stop=lambda: False) -> dict[str, float]:
        self.warm_started += 1
        return {"sft_steps": 0}

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        if self.fail_with is not None:
            raise self.fail_with
        self.steps.append(list(samples))
        return dict(self.metrics)

    def save_weights(self, path: str) -> str:
        data = f"weights #{len(self.saved)}".encode()
        Path(path).write_bytes(data)
        self.saved.append(path)
        return hashlib.sha256(data).hexdigest()

    def save_checkpoint(self, directory: str) -> list[str]:
        Path(directory, "state.txt").write_text(str(len(self.steps)))
        return ["state.txt"]

    def load_checkpoint(self, directory: str) -> None:
        int(Path(directory, "state.txt").read_text())
        self.loaded_checkpoints.append(directory)

    def load_model_weights(self, checkpoint_dir: str) -> None:
        Path(checkpoint_dir, "state.txt").read_text()
        self.loaded_model_weights.append(checkpoint_dir)

    @property
    def trained_ids(self) -> list[str]:
        return [s.trajectory_id for step in self.steps for s in step]


@dataclass
class FakeBackendFactory:
    backend: FakeBackend = field(default_factory=FakeBackend)
    created: list[tuple[JobSpec, str]] = field(default_factory=list)

    def create(self, spec: JobSpec, model_dir: str) -> FakeBackend:
        self.created.append((spec, model_dir))
        return self.backend
