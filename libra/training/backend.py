"""Torch adapter of the trainer: builds the job's model, warm-starts it, trains it.

The only module of the trainer service (with torch_backend.py and loss.py, which it
wraps) that imports torch/transformers. The model is the built-in tiny Llama (a seeded
random init) or a Hugging Face directory (``[model] kind = "hf"``); either way the
trainer writes it to the job's model directory as an HF directory, which rollout
engines load, and publishes weights under the HF parameter names.

Warm start: supervised steps on demonstrations of the job's protocol, the tag protocol
for the tiny model, chat conversations with tool calls (rendered by the same chat
protocol the rollout uses, libra/chat) for chat models.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from libra.chat.job import chat_format
from libra.data import DatasetSplit, open_job_dataset
from libra.jobspec import JobSpec
from libra.models.hf import default_device, load_causal_lm, load_tokenizer
from libra.models.tiny import (
    TinyModelConfig,
    build_model,
    build_tokenizer,
    encode_segments,
    save_model_dir,
)
from libra.run_dir import CHECKPOINT_MODEL
from libra.tasks import chat_demonstration
from libra.tasks.arith import demonstration
from libra.training.samples import SftExample, TrainSample
from libra.training.tensors import state_checksum
from libra.training.torch_backend import TorchTrainerBackend

NUM_DEMONSTRATIONS = 4096


class JobBackend:
    """A job's policy: warm start on demonstrations, then PPO-clip steps."""

    def __init__(self, spec: JobSpec, model_dir: str, num_threads: int,
                 write_model_dir: bool = True, device: str = "") -> None:
        self._spec = spec
        device = device or default_device()
        model, self._tokenizer = _build_policy(spec, device)
        pad_id = self._tokenizer.pad_token_id
        a = spec.algorithm
        self._backend = TorchTrainerBackend(
            model, pad_token_id=pad_id if pad_id is not None else self._tokenizer.eos_token_id,
            seed=a.seed, learning_rate=a.learning_rate, max_grad_norm=a.max_grad_norm,
            num_threads=num_threads, device=device,
            gradient_checkpointing=spec.model.gradient_checkpointing,
            micro_batch_size=a.micro_batch_size)
        if write_model_dir:
            save_model_dir(model, self._tokenizer, model_dir)

    @property
    def model(self) -> torch.nn.Module:
        """The policy being trained."""
        return self._backend.model

    def enable_data_parallel(self, parallelism: str = "ddp", device: str = "cpu") -> None:
        """Train as one rank of the default process group (see distributed.py)."""
        self._backend.enable_data_parallel(parallelism, device)

    def warm_start(self, should_stop: Callable[[], bool] = lambda: False) -> dict[str, float]:
        """Supervised steps on the job's demonstrations; ends early once ``should_stop``
        (asked before every step) says so."""
        a, task = self._spec.algorithm, self._spec.task
        if a.sft_steps == 0:
            return {"sft_steps": 0}
        prompts = open_job_dataset(task).train
        count = min(NUM_DEMONSTRATIONS, max(a.sft_steps * a.sft_batch_size, len(prompts)))
        problems = prompts.problems()
        if problems is not None:  # a built-in task: demonstrations made from its problems
            examples = _demonstrations(self._spec, self._tokenizer, problems, count)
            extra: dict[str, float] = {}
        else:  # a file dataset: each row's task.demonstration_field conversation
            examples, skipped = _row_demonstrations(self._spec, self._tokenizer, prompts, count)
            extra = {"sft_rows_skipped": skipped}
        started = time.perf_counter()
        losses = self._backend.sft(examples, a.sft_steps, a.sft_batch_size, a.sft_learning_rate,
                                   should_stop)
        if not losses:
            return {"sft_steps": 0, "sft_stopped": 1.0}
        return {"sft_steps": len(losses), "sft_loss_first": losses[0],
                "sft_loss_last": losses[-1], "sft_s": time.perf_counter() - started, **extra}

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One PPO-clip step with the spec's hyperparameters; returns the step's metrics."""
        a = self._spec.algorithm
        return self._backend.train_step(samples, lr=a.learning_rate, clip_eps=a.clip_eps,
                                        kl_coef=a.kl_coef, is_cap=a.is_cap)

    def save_weights(self, path: str) -> str:
        """Publish the weights file; returns its sha256."""
        return self._backend.save_weights(path)

    def save_checkpoint(self, directory: str) -> list[str]:
        """Write a checkpoint into ``directory``; returns the file names."""
        return self._backend.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint`."""
        self._backend.load_checkpoint(directory)

    def load_model_weights(self, checkpoint_dir: str) -> None:
        """``init_from``: a checkpoint's model weights only (optimizer, RNG, step fresh).

        Raises:
            ValueError: A missing, unexpected or mis-shaped tensor (named); nothing loaded.
        """
        self._backend.load_weights(str(Path(checkpoint_dir) / CHECKPOINT_MODEL))


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


def _build_policy(spec: JobSpec, device: str) -> tuple[torch.nn.Module, object]:
    """The job's initial model (on ``device``, in train dtype) and its tokenizer."""
    m = spec.model
    if m.kind == "hf":
        return load_causal_lm(m.path, dtype=m.dtype, device=device), load_tokenizer(m.path)
    cfg = TinyModelConfig(hidden_size=m.hidden_size, num_layers=m.num_layers,
                          num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                          max_context_tokens=m.max_position_embeddings)
    return build_model(cfg, seed=m.seed).to(device), build_tokenizer()


def _demonstrations(spec: JobSpec, tokenizer: object, problems: list,
                    count: int) -> list[SftExample]:
    """``count`` warm-start examples in the job's protocol (seeded: equal on every rank)."""
    rng = random.Random(spec.algorithm.seed)
    failure_rate = spec.tools.calculator_transient_failure_rate
    max_turns = spec.task.max_turns
    examples = []
    if spec.task.tool_call_format == "arith":
        for i in range(count):
            segments = demonstration(problems[i % len(problems)], rng,
                                     failure_rate=failure_rate, max_turns=max_turns)
            ids, mask = encode_segments(tokenizer, segments)
            examples.append(SftExample(token_ids=ids, loss_mask=mask))
        return examples
    chat = chat_format(spec, tokenizer)
    for i in range(count):
        messages = chat_demonstration(problems[i % len(problems)], rng,
                                      failure_rate=failure_rate, max_turns=max_turns)
        ids, mask = chat.demonstration(messages)
        examples.append(SftExample(token_ids=ids, loss_mask=mask))
    return examples


def _row_demonstrations(spec: JobSpec, tokenizer: object, prompts: DatasetSplit,
                        count: int) -> tuple[list[SftExample], int]:
    """``count`` warm-start examples from the rows' conversations, in the serving order
    (equal on every rank), and how many rows were skipped because they could not be
    rendered (the submit check renders only the first rows; see docs/datasets.md)."""
    chat = chat_format(spec, tokenizer)
    examples: list[SftExample] = []
    bad: set[str] = set()  # prompt ids ("row-<index>") of rows skipped
    draw, misses = 0, 0
    while len(examples) < count:
        if misses >= len(prompts):
            raise ValueError(f"no demonstration of the dataset renders ({len(bad)} bad rows)")
        drawn = prompts.draw_renderable(draw)
        draw += drawn.num_draws
        bad.update(f"row-{error.row}" for error in drawn.skipped)
        try:
            ids, mask = chat.demonstration(drawn.row.demonstration() or [])
        except ValueError:  # the template refuses the conversation
            bad.add(drawn.row.prompt_id)
            misses += 1
            continue
        misses = 0
        examples.append(SftExample(token_ids=ids, loss_mask=mask))
    return examples, len(bad)


class TorchBackendFactory:
    """Builds a torch ``JobBackend`` per job (the trainer core's backend factory)."""

    def __init__(self, num_threads: int = 1) -> None:
        self._num_threads = num_threads

    def create(self, spec: JobSpec, model_dir: str) -> JobBackend:
        """The job's backend, its model written to ``model_dir`` for the rollout engines."""
        return JobBackend(spec, model_dir, self._num_threads)

