"""Torch adapter of the trainer: builds the job's model, warm-starts it, trains it.

The only module of the trainer service (with torch_backend.py and loss.py, which it
wraps) that imports torch/transformers.
"""

from __future__ import annotations

import random
import time

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from libra.jobspec import JobSpec
from libra.models.tiny import (
    TinyModelConfig,
    build_model,
    build_tokenizer,
    encode_segments,
    save_model_dir,
)
from libra.tasks.arith import ArithDataset, demonstration
from libra.training.samples import SftExample, TrainSample
from libra.training.tensors import state_checksum
from libra.training.torch_backend import TorchTrainerBackend

NUM_DEMONSTRATIONS = 4096


class JobBackend:
    """A job's policy: warm start on demonstrations, then PPO-clip steps."""

    def __init__(self, spec: JobSpec, model_dir: str, num_threads: int,
                 write_model_dir: bool = True) -> None:
        self._spec = spec
        m = spec.model
        cfg = TinyModelConfig(hidden_size=m.hidden_size, num_layers=m.num_layers,
                              num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                              max_context_tokens=m.max_position_embeddings)
        self._tokenizer = build_tokenizer()
        model = build_model(cfg, seed=m.seed)
        a = spec.algorithm
        self._backend = TorchTrainerBackend(
            model, pad_token_id=self._tokenizer.pad_token_id, seed=a.seed,
            learning_rate=a.learning_rate, max_grad_norm=a.max_grad_norm,
            num_threads=num_threads)
        if write_model_dir:
            save_model_dir(model, self._tokenizer, model_dir)

    @property
    def model(self) -> torch.nn.Module:
        return self._backend.model

    def enable_data_parallel(self, parallelism: str = "ddp", device: str = "cpu") -> None:
        """Train as one rank of the default process group (see distributed.py)."""
        self._backend.enable_data_parallel(parallelism, device)

    def warm_start(self) -> dict[str, float]:
        """Supervised steps on synthetic demonstrations (a deliberate mix of habits)."""
        a, task = self._spec.algorithm, self._spec.task
        if a.sft_steps == 0:
            return {"sft_steps": 0}
        rng = random.Random(a.seed)
        problems = list(ArithDataset(task.seed, task.num_prompts))
        examples = []
        for i in range(NUM_DEMONSTRATIONS):
            segments = demonstration(problems[i % len(problems)], rng,
                                     failure_rate=self._spec.tools.calculator_transient_failure_rate,
                                     max_turns=task.max_turns)
            ids, mask = encode_segments(self._tokenizer, segments)
            examples.append(SftExample(token_ids=ids, loss_mask=mask))
        started = time.perf_counter()
        losses = self._backend.sft(examples, a.sft_steps, a.sft_batch_size, a.sft_learning_rate)
        return {"sft_steps": a.sft_steps, "sft_loss_first": losses[0],
                "sft_loss_last": losses[-1], "sft_s": time.perf_counter() - started}

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        a = self._spec.algorithm
        return self._backend.train_step(samples, lr=a.learning_rate, clip_eps=a.clip_eps,
                                        kl_coef=a.kl_coef, is_cap=a.is_cap)

    def save_weights(self, path: str) -> str:
        return self._backend.save_weights(path)

    def save_checkpoint(self, directory: str) -> list[str]:
        return self._backend.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self._backend.load_checkpoint(directory)


    # -- elastic hybrid pool (one rank; gradients travel as safetensors bytes) ---------

    def slice_gradient(self, samples: list[TrainSample], scale: float
                       ) -> tuple[bytes, dict[str, float], bool]:
        """This slice's scaled gradient, its metrics and whether it is finite."""
        a = self._spec.algorithm
        grads, metrics, finite = self._backend.slice_gradient(
            samples, scale, clip_eps=a.clip_eps, kl_coef=a.kl_coef, is_cap=a.is_cap)
        return save_bytes(grads), metrics, finite

    def apply_slices(self, payloads: list[bytes]) -> tuple[float, bytes]:
        """Sum the slices' gradients (in order), step; returns (grad norm, the sum).

        The sum goes to the hybrids as is, so they apply bitwise the same update.
        """
        merged: dict[str, torch.Tensor] = {}
        for data in payloads:
            for name, grad in load_bytes(data).items():
                merged[name] = merged[name] + grad if name in merged else grad
        data = save_bytes(merged)
        return self._backend.apply_gradients(merged, self._spec.algorithm.learning_rate), data

    def apply_update(self, data: bytes, lr: float) -> float:
        """A hybrid applies the core's merged gradient (lockstep)."""
        return self._backend.apply_gradients(load_bytes(data), lr)

    def checksum(self) -> str:
        """sha256 over the weights (lockstep checks)."""
        return state_checksum(self._backend.model)


class TorchBackendFactory:
    def __init__(self, num_threads: int = 1) -> None:
        self._num_threads = num_threads

    def create(self, spec: JobSpec, model_dir: str) -> JobBackend:
        return JobBackend(spec, model_dir, self._num_threads)

