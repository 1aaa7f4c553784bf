"""Training-step time and memory of the core training group (pure arithmetic)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduling.planner.specs import HardwareSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class TrainParallelism:
    """Training parallelism of the core group (one replica is ``tp * pp`` devices)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int = 1

    @property
    def num_gpus(self) -> int:
        """Devices of the training group."""
        return self.tp * self.pp * self.dp


DP_EXPOSED_FRACTION = {True: 0.70, False: 0.50}
"""Fraction of the DP gradient all-reduce not hidden behind backward (reference: 70% for
pp = 1, 50% for pp > 1)."""


def train_step_s(
    hw: HardwareSpec,
    model: ModelSpec,
    par: TrainParallelism,
    tokens_per_step: float,
    mean_seq_tokens: float,
) -> float:
    """One GRPO training step: log-prob recompute forward plus forward/backward.

    FLOPs = (2 recompute + 6 train) x active params x tokens, plus causal attention;
    divided over the group at ``train_mfu``; plus the exposed DP all-reduce of bf16
    gradients over the inter-node network and the 1F1B pipeline bubble.
    """
    if par.num_gpus <= 0:
        return math.inf
    attn = 4.0 * model.num_layers * model.num_heads * model.head_dim * mean_seq_tokens / 2.0
    flops = (8.0 * model.num_active_params + 4.0 * attn) * tokens_per_step
    compute = flops / (par.num_gpus * hw.peak_flops * hw.train_mfu)
    micro_batches = max(
        1.0, tokens_per_step / max(1.0, mean_seq_tokens) / (par.dp * par.micro_batch)
    )
    compute *= 1.0 + (par.pp - 1) / micro_batches
    grad_bytes = model.num_params * 2.0 / (par.tp * par.pp)
    allreduce = 0.0
    if par.dp > 1:
        allreduce = 2.0 * (par.dp - 1) / par.dp * grad_bytes / hw.inter_node_bw_bytes_per_s
    return compute + DP_EXPOSED_FRACTION[par.pp == 1] * allreduce


def train_memory_fits(
    hw: HardwareSpec, model: ModelSpec, par: TrainParallelism, seq_tokens: int
) -> bool:
    """Weights + grads (bf16) + distributed Adam state (12 B/param over DP) + activations.

    Activations: 34 x seq x hidden bytes per layer over TP (Korthikanti et al. 2022,
    selective recompute with sequence parallelism), layers split over PP; plus the
    log-prob logits temporary (seq x vocab/TP x 4 B x 1.5).
    """
    shard = model.num_params / (par.tp * par.pp)
    states = 4.0 * shard + 12.0 * shard / par.dp
    act = (
        34.0
        * seq_tokens
        * par.micro_batch
        * model.hidden_size
        * model.num_layers
        / (par.tp * par.pp)
    )
    logits = seq_tokens * par.micro_batch * model.vocab_size / par.tp * 4.0 * 1.5
    return states + act + logits <= hw.hbm_bytes * 0.92
