"""The policy's forward passes for the torch trainer backend: batches moved to the
model's device, the compute precision, float32 token log-probs and the decoupled PPO-clip
loss (``loss.ppo_clip_loss``). :class:`~libra.training.torch_backend.TorchTrainerBackend`
composes one; the optimizer, its steps and the process group stay there.

Device and precision: the model and every batch tensor live on one device. Compute runs
under bfloat16 autocast on CUDA, and on CPU when the model came in bfloat16; float32 on
CPU otherwise. Log-probs always come from a float32 softmax.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from libra.training.loss import ppo_clip_loss
from libra.training.samples import TrainSample
from libra.training.tensors import right_pad, right_pad_floats, token_logprobs


@dataclass
class PolicyLoss:
    """What :meth:`PolicyForward.policy_loss` computed."""

    loss: torch.Tensor
    metrics: dict[str, float]
    num_tokens: float
    recompute_s: float
    started: float
    """``time.perf_counter()`` when the forward with grad began."""


class PolicyForward:
    """Forward passes of ``model`` on one device.

    Args:
        model: The policy (float32 master weights already).
        pad_token_id: Token used to right-pad batches (masked out everywhere).
        publish_dtype: The dtype the model came in (bfloat16 turns on autocast on CPU).
        device: Where the model and the batches go (``cpu``, ``cuda``, ``cuda:<n>``).
    """

    def __init__(self, model: PreTrainedModel, pad_token_id: int, publish_dtype: torch.dtype,
                 device: str) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self._publish_dtype = publish_dtype
        # The module forwards go through: the DDP wrapper under data parallel (set by
        # the backend), else the bare model.
        self.forward_model: torch.nn.Module = model
        self.place(device)

    def place(self, device: str) -> None:
        """Move the model to ``device`` and pick the compute dtype there."""
        target = torch.device(device)
        if target.type == "cuda" and target.index is None:
            target = torch.device("cuda", torch.cuda.current_device())
        self.model.to(target)
        self.device = target
        self._autocast_bf16 = target.type == "cuda" or self._publish_dtype == torch.bfloat16

    @property
    def compute_dtype(self) -> torch.dtype:
        """bfloat16 under autocast, else float32 (parameters are float32 either way)."""
        return torch.bfloat16 if self._autocast_bf16 else torch.float32

    def to_device(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(tensor.to(self.device, non_blocking=True) for tensor in tensors)

    @contextlib.contextmanager
    def compute_precision(self) -> Iterator[None]:
        """bfloat16 autocast where chosen (see the module docstring), else nothing."""
        if not self._autocast_bf16:
            yield
            return
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            yield

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """``[B, T]`` float32 log-prob of each token given its prefix; column 0 is 0."""
        with self.compute_precision():
            # No KV cache while training: nothing reuses it, and it holds activations.
            logits = self.forward_model(input_ids=input_ids, attention_mask=attention_mask,
                                        use_cache=False).logits
        return token_logprobs(logits, input_ids)

    def policy_loss(self, samples: Sequence[TrainSample], *, clip_eps: float,
                    kl_coef: float, is_cap: float | None) -> PolicyLoss:
        """The decoupled PPO-clip loss of ``samples`` (token mean), with grad, no step.

        Recomputes the proximal log-probs with the current weights first (no grad), then
        the new log-probs with grad; leaves the model in train mode.
        """
        padded = right_pad([(sample.token_ids, sample.loss_mask) for sample in samples],
                           self.pad_token_id)
        num_tokens = float(padded[2].sum())  # on the CPU: no device sync
        input_ids, attention_mask, loss_mask, behaviour, advantages = self.to_device(
            *padded, right_pad_floats([sample.rollout_logprobs for sample in samples]),
            torch.tensor([sample.advantage for sample in samples], dtype=torch.float32))
        started = time.perf_counter()
        self.model.eval()
        with torch.no_grad():
            old_logprobs = self.token_logprobs(input_ids, attention_mask)
        if self.device.type == "cuda":  # CUDA runs ahead of the host: time the work itself
            torch.cuda.synchronize(self.device)
        recompute_s = time.perf_counter() - started
        started = time.perf_counter()
        self.model.train()
        new_logprobs = self.token_logprobs(input_ids, attention_mask)
        loss, metrics = ppo_clip_loss(
            new_logprobs, old_logprobs, advantages, loss_mask, clip_eps, kl_coef, behaviour,
            is_cap,
        )
        return PolicyLoss(loss, metrics, num_tokens, recompute_s, started)


def floating_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters (float32 when it has none)."""
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32
