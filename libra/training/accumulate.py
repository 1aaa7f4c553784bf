"""A batch's gradient in pieces: micro-batches on one rank, slices of the elastic pool.

Each piece's token-mean loss is weighted by its share of the batch's tokens, so the sum
of the pieces' gradients is the gradient of the whole batch's token mean: the update is
the one a single forward/backward over the batch would give, while only one piece's
activations (the ``[B, T, vocab]`` logits above all) are held at once. The backend
(``torch_backend``) clips and steps once, after the pieces.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from libra.training.policy_forward import PolicyLoss
from libra.training.samples import TrainSample

PolicyLossFn = Callable[[Sequence[TrainSample]], PolicyLoss]


@dataclass(frozen=True, slots=True)
class Accumulated:
    """What the pieces left: token-weighted metric sums, the batch's tokens, and whether
    every piece's loss was finite (else no backward ran after the first bad piece)."""

    sums: dict[str, float]
    num_tokens: float
    finite: bool


def accumulate_micro_batches(policy_loss: PolicyLossFn, samples: Sequence[TrainSample],
                             size: int) -> Accumulated:
    """Backward each ``size``-sample micro-batch's loss times its token share.

    Gradients add up in the parameters' ``.grad`` (the caller zeroes them before and steps
    after); metrics are token-weighted the same way, times are summed.
    """
    total = float(sum(sum(sample.loss_mask) for sample in samples)) or 1.0
    sums: dict[str, float] = {"loss": 0.0, "recompute_s": 0.0, "fwd_bwd_s": 0.0}
    finite = True
    for start in range(0, len(samples), size):
        pl = policy_loss(samples[start:start + size])
        share = pl.num_tokens / total
        finite = finite and bool(torch.isfinite(pl.loss))
        if finite:
            (pl.loss * share).backward()
        for name, value in {**pl.metrics, "loss": float(pl.loss.detach())}.items():
            sums[name] = sums.get(name, 0.0) + value * share
        sums["recompute_s"] += pl.recompute_s
        sums["fwd_bwd_s"] += time.perf_counter() - pl.started
    return Accumulated(sums, total, finite)


def cpu_gradients(model: torch.nn.Module, finite: bool) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, copied to the CPU (zeros where there is none, or for
    all when ``finite`` is False): a slice's gradient travels to the other workers as
    safetensors bytes, and the pool sums slices by parameter name."""
    return {name: (p.grad.detach().cpu().clone() if p.grad is not None and finite
                   else torch.zeros_like(p, device="cpu"))
            for name, p in model.named_parameters()}
