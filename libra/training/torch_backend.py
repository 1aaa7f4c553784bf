"""Single-process torch trainer backend: supervised warm start and GRPO/PPO steps.

The trainer core hands batches of :class:`TrainSample` to :meth:`train_step` and
publishes :meth:`save_weights` files to rollout workers. One optimizer step per call
(one PPO epoch, as in the reference). Decoupled PPO: the proximal log-probs are
recomputed with the current weights before the update (the ratio's denominator), and the
engine's behaviour log-probs importance-weight tokens sampled by an older policy
(``loss.behaviour_weights``) and measure drift. :meth:`save_checkpoint` and
:meth:`load_checkpoint` persist everything a resumed run needs (model, optimizer, RNG).

Data parallel (:meth:`TorchTrainerBackend.enable_data_parallel`, driven by
``services/trainer/distributed.py``): every rank of the default torch.distributed group
holds the same backend; each batch (the PPO batch, each SFT batch drawn from the shared
seeded sampler) is split by stride across ranks, each rank runs forward/backward on its
shard through ``DistributedDataParallel`` (which all-reduces the gradients) or an FSDP2
``fully_shard`` model (which reduce-scatters them; each rank holds 1/N of the parameters and
optimizer state), and every rank steps its own optimizer (shard), so the ranks stay in
step. The loss is rescaled so the averaged gradient equals the gradient of the *global*
token mean (what one rank computes on the whole batch); metrics are token-weighted means
over the ranks. A non-finite loss on any rank skips the step on all ranks (one all-reduced
flag); the grad norm is computed after the gradient reduction, so a non-finite gradient is
seen by every rank alike.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from libra.training.loss import masked_mean, ppo_clip_loss
from libra.training.parallel import (
    PARALLELISMS,
    broadcast_from_rank0,
    full_optimizer_state,
    full_state_dict,
    fully_shard_layers,
    load_full_state_dict,
    load_optimizer_state,
    place_on_device,
    same_optimizer_over,
)
from libra.training.samples import SftExample, TrainSample
from libra.weight_sync import sha256_file

logger = logging.getLogger(__name__)


@dataclass
class PolicyLoss:
    """What :meth:`TorchTrainerBackend.policy_loss` computed."""

    loss: torch.Tensor
    metrics: dict[str, float]
    num_tokens: float
    recompute_s: float
    started: float
    """``time.perf_counter()`` when the forward with grad began."""


class TorchTrainerBackend:
    """Holds the policy and its AdamW optimizer.

    Args:
        model: The causal LM to train (in place).
        pad_token_id: Token used to right-pad batches (masked out everywhere).
        seed: Seeds torch and the SFT batch sampler, so runs are reproducible.
        learning_rate: Default learning rate of :meth:`train_step`.
        weight_decay: AdamW weight decay.
        max_grad_norm: Global grad-norm clip.
        num_threads: ``torch.set_num_threads`` value.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        pad_token_id: int,
        seed: int = 0,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.0,
        max_grad_norm: float = 1.0,
        num_threads: int = 1,
    ) -> None:
        torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self._model = model
        self._pad_token_id = pad_token_id
        self._learning_rate = learning_rate
        self._max_grad_norm = max_grad_norm
        self._rng = random.Random(seed)
        self._optimizer = torch.optim.AdamW(
            model.parameters(), lr=learning_rate, weight_decay=weight_decay
        )
        self._num_steps = 0
        # Data parallel (enable_data_parallel): this rank, the group size, the DDP wrapper
        # that forwards go through (the bare model on a single rank).
        self._rank = 0
        self._world = 1
        self._forward_model: torch.nn.Module = model

    def enable_data_parallel(self, parallelism: str = "ddp", device: str = "cpu") -> None:
        """Join the (initialised) default process group: shard batches, reduce gradients.

        Args:
            parallelism: ``ddp`` (every rank holds the whole model; DDP broadcasts rank 0's
                parameters and all-reduces gradients) or ``fsdp2`` (rank 0's parameters are
                broadcast, then ``fully_shard`` on each decoder layer and the root: each rank
                keeps 1/N of every parameter and of the optimizer state; gradients are
                reduce-scattered). Both average gradients over ranks, so the loss scaling of
                :meth:`_reduce_loss` holds for either.
            device: ``cpu``, or ``cuda:<local rank>`` (GPU path: :func:`parallel.place_on_device`).
        """
        if parallelism not in PARALLELISMS:
            raise ValueError(f"parallelism must be one of {PARALLELISMS}, got {parallelism!r}")
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        if torch.device(device).type != "cpu":
            place_on_device(self._model, torch.device(device))
        if parallelism == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # Buffers (rotary tables) are the same on every rank: synced once at init,
            # not before every forward.
            self._forward_model = DistributedDataParallel(self._model, forward_sync_buffers=False)
            return
        broadcast_from_rank0(self._model)
        fully_shard_layers(self._model, torch.device(device).type)
        # fully_shard swapped in sharded (DTensor) parameters: the optimizer must hold them.
        self._optimizer = same_optimizer_over(self._optimizer, self._model)

    @property
    def model(self) -> PreTrainedModel:
        """The policy being trained."""
        return self._model

    def sft(
        self, examples: Sequence[SftExample], num_steps: int, batch_size: int, lr: float
    ) -> list[float]:
        """Supervised warm start: token-mean cross-entropy on masked (trainable) tokens.

        The learning rate warms up linearly over the first 5% of steps and then decays
        linearly to 10% of ``lr``: a short, high-LR run reaches a much lower loss this way
        than at a constant rate, which matters on a 60-second CPU budget.

        Returns:
            The loss of every step.
        """
        losses: list[float] = []
        self._model.train()
        for step in range(num_steps):
            batch = self._rng.sample(list(examples), k=min(batch_size, len(examples)))
            batch, weight = self._shard(batch)
            input_ids, attention_mask, loss_mask = _right_pad(
                [(example.token_ids, example.loss_mask) for example in batch], self._pad_token_id
            )
            logprobs = self._token_logprobs(input_ids, attention_mask)
            loss = -masked_mean(logprobs, loss_mask)
            loss, loss_value, finite = self._reduce_loss(loss, float(loss_mask.sum()) * weight)
            losses.append(loss_value)
            self._apply(loss, _sft_learning_rate(step, num_steps, lr), finite)
        self._model.eval()
        return losses

    def train_step(
        self,
        samples: Sequence[TrainSample],
        *,
        lr: float | None = None,
        clip_eps: float = 0.2,
        kl_coef: float = 0.0,
        is_cap: float | None = None,
    ) -> dict[str, float]:
        """One decoupled PPO-clip optimizer step on a batch of trajectories.

        Args:
            samples: The batch (complete groups).
            lr: Learning rate of this step (the constructor's when None).
            clip_eps: PPO clip range.
            kl_coef: KL penalty weight (against the proximal policy).
            is_cap: Behaviour importance-weight cap; None disables the correction.

        Returns:
            Metrics: ``loss``, ``grad_norm``, ``clip_fraction``, ``approx_kl``,
            ``logprob_drift``, (with ``is_cap``) ``is_weight_mean`` and
            ``is_truncated_fraction``, ``num_tokens``, ``recompute_s``, ``fwd_bwd_s`` and
            ``is_skipped`` (1.0 when the loss or the gradient was non-finite and the
            weights were left untouched).
        """
        samples, weight = self._shard(samples)
        pl = self.policy_loss(samples, clip_eps=clip_eps, kl_coef=kl_coef, is_cap=is_cap)
        loss, metrics, recompute_s, started = pl.loss, pl.metrics, pl.recompute_s, pl.started
        # 3) Backward, clip, step (or skip on a non-finite loss or gradient).
        num_tokens = pl.num_tokens * weight
        loss, loss_value, finite = self._reduce_loss(loss, num_tokens)
        grad_norm = self._apply(loss, self._learning_rate if lr is None else lr, finite)
        self._model.eval()
        metrics = self._reduce_metrics(metrics, num_tokens)
        metrics.update(
            loss=loss_value,
            grad_norm=grad_norm,
            recompute_s=recompute_s,
            fwd_bwd_s=time.perf_counter() - started,
            is_skipped=float(not math.isfinite(grad_norm)),
        )
        if self._world > 1:  # the slowest rank's times
            times = torch.tensor([recompute_s, metrics["fwd_bwd_s"]], dtype=torch.float64)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            metrics.update(recompute_s=float(times[0]), fwd_bwd_s=float(times[1]))
        return metrics

    def policy_loss(self, samples: Sequence[TrainSample], *, clip_eps: float,
                    kl_coef: float, is_cap: float | None) -> PolicyLoss:
        """The decoupled PPO-clip loss of ``samples`` (token mean), with grad, no step.

        Recomputes the proximal log-probs with the current weights first (no grad), then
        the new log-probs with grad; leaves the model in train mode.
        """
        input_ids, attention_mask, loss_mask = _right_pad(
            [(sample.token_ids, sample.loss_mask) for sample in samples], self._pad_token_id
        )
        behaviour = _right_pad_floats([sample.rollout_logprobs for sample in samples])
        advantages = torch.tensor([sample.advantage for sample in samples], dtype=torch.float32)
        started = time.perf_counter()
        self._model.eval()
        with torch.no_grad():
            old_logprobs = self._token_logprobs(input_ids, attention_mask)
        recompute_s = time.perf_counter() - started
        started = time.perf_counter()
        self._model.train()
        new_logprobs = self._token_logprobs(input_ids, attention_mask)
        loss, metrics = ppo_clip_loss(
            new_logprobs, old_logprobs, advantages, loss_mask, clip_eps, kl_coef, behaviour,
            is_cap,
        )
        return PolicyLoss(loss, metrics, float(loss_mask.sum()), recompute_s, started)

    def slice_gradient(self, samples: Sequence[TrainSample], scale: float, *,
                       clip_eps: float, kl_coef: float, is_cap: float | None
                       ) -> tuple[dict[str, torch.Tensor], dict[str, float], bool]:
        """Gradient of ``scale`` x (token-mean loss of this slice); no optimizer step.

        With ``scale`` = slice tokens / batch tokens, the sum of the slices' gradients is
        the gradient of the whole batch's token mean (elastic hybrid pool, one rank).
        Returns (gradient by parameter name, token-mean metrics, finite).
        """
        pl = self.policy_loss(samples, clip_eps=clip_eps, kl_coef=kl_coef, is_cap=is_cap)
        self._optimizer.zero_grad(set_to_none=True)
        finite = bool(torch.isfinite(pl.loss))
        if finite:
            (pl.loss * scale).backward()
        grads = {name: (p.grad.detach().clone() if p.grad is not None and finite
                        else torch.zeros_like(p)) for name, p in self._model.named_parameters()}
        self._optimizer.zero_grad(set_to_none=True)
        self._model.eval()
        finite = finite and all(bool(torch.isfinite(g).all()) for g in grads.values())
        metrics = {**pl.metrics, "loss": float(pl.loss.detach()), "num_tokens": pl.num_tokens,
                   "recompute_s": pl.recompute_s,
                   "fwd_bwd_s": time.perf_counter() - pl.started}
        return grads, metrics, finite

    def apply_gradients(self, grads: dict[str, torch.Tensor], lr: float) -> float:
        """Clip and step with the given (merged) gradient; returns the grad norm.

        Core and hybrids call this with bitwise-equal gradients and optimizer states,
        so their weights stay bitwise equal (lockstep).
        """
        for name, param in self._model.named_parameters():
            param.grad = grads[name].clone()
        return self._clip_and_step(lr)

    def save_weights(self, path: str) -> str:
        """Write the state dict as safetensors; returns the file's sha256 hex digest.

        Under FSDP2 every rank must call this (the full state dict is gathered); only rank 0
        writes, the other ranks return ``""``.

        Raises:
            ValueError: A tensor holds a non-finite value (never publish NaN weights).
        """
        state_dict = full_state_dict(self._model)
        if self._rank != 0:
            return ""
        bad = [name for name, tensor in state_dict.items()
               if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
        if bad:
            raise ValueError(f"refusing to publish non-finite weights: {bad[:5]}")
        save_file(state_dict, path)
        return sha256_file(Path(path))

    def load_weights(self, path: str) -> None:
        """Load a safetensors state dict written by :meth:`save_weights` (optimizer kept)."""
        with torch.no_grad():
            self._model.load_state_dict(load_file(path), strict=True)

    def save_checkpoint(self, directory: str) -> list[str]:
        """Write model, optimizer and RNG state into ``directory``; returns the file names.

        Model and optimizer state are saved whole (full state dicts, optimizer state keyed
        by parameter name), so a checkpoint loads into 1 rank, DDP or FSDP2 alike. With
        several ranks every rank must call this (FSDP2 gathers); only rank 0 writes, the
        others return ``[]``.
        """
        model_state = full_state_dict(self._model)
        optimizer_state = full_optimizer_state(self._model, self._optimizer)
        if self._rank != 0:
            return []
        folder = Path(directory)
        save_file({name: tensor.clone() for name, tensor in model_state.items()},
                  str(folder / _CKPT_MODEL))
        torch.save(optimizer_state, folder / _CKPT_OPTIMIZER)
        torch.save({"torch_rng": torch.get_rng_state(), "python_rng": self._rng.getstate(),
                    "num_steps": self._num_steps}, folder / _CKPT_RNG)
        return [_CKPT_MODEL, _CKPT_OPTIMIZER, _CKPT_RNG]

    def load_checkpoint(self, directory: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (every rank reads the same files).

        Under FSDP2 each rank keeps only its shard of the full state it read.

        Raises:
            ValueError: A file is unreadable or does not fit the model; names the file.
        """
        folder = Path(directory)
        loaders = (
            (_CKPT_MODEL, lambda path: load_full_state_dict(self._model, load_file(str(path)))),
            (_CKPT_OPTIMIZER, lambda path: load_optimizer_state(
                self._model, self._optimizer, torch.load(path, weights_only=False))),
            (_CKPT_RNG, self._load_rng),
        )
        for name, load in loaders:
            try:
                with torch.no_grad():
                    load(folder / name)
            except Exception as exc:
                raise ValueError(f"corrupt checkpoint file {folder / name}: {exc}") from exc

    def _load_rng(self, path: Path) -> None:
        state = torch.load(path, weights_only=False)
        torch.set_rng_state(state["torch_rng"])
        self._rng.setstate(state["python_rng"])
        self._num_steps = int(state["num_steps"])

    def _token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """``[B, T]`` log-prob of each token given its prefix; column 0 is 0 (no prefix)."""
        logits = self._forward_model(input_ids=input_ids, attention_mask=attention_mask).logits
        logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        picked = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)

    def _shard(self, items: Sequence) -> tuple[list, float]:
        """This rank's stride of ``items`` and its weight (0.0: a stand-in, counts nothing).

        A rank left without items runs the first one with weight 0 so that every rank
        still takes part in the gradient all-reduce.
        """
        if self._world == 1:
            return list(items), 1.0
        shard = list(items[self._rank::self._world])
        return (shard, 1.0) if shard else (list(items[:1]), 0.0)

    def _reduce_loss(
        self, loss: torch.Tensor, num_tokens: float
    ) -> tuple[torch.Tensor, float, bool]:
        """(loss to backward, global loss value, finite on every rank).

        This rank's loss is its shard's token mean; scaled by ``world * n_local / n_total``
        the DDP gradient average equals the gradient of the global token mean.
        """
        finite = bool(torch.isfinite(loss))
        if self._world == 1:
            return loss, float(loss.detach()), finite
        stats = torch.tensor([num_tokens, float(loss.detach()) * num_tokens if finite else 0.0,
                              0.0 if finite else 1.0], dtype=torch.float64)
        dist.all_reduce(stats)
        total = float(stats[0])
        scale = self._world * num_tokens / total if total > 0 else 0.0
        return loss * scale, float(stats[1]) / max(total, 1.0), float(stats[2]) == 0.0

    def _reduce_metrics(self, metrics: dict[str, float], num_tokens: float) -> dict[str, float]:
        """Token-weighted mean of per-shard token-mean metrics; ``num_tokens`` summed."""
        if self._world == 1:
            return {**metrics, "num_tokens": num_tokens}
        names = sorted(metrics)
        values = torch.tensor([metrics[name] * num_tokens for name in names] + [num_tokens],
                              dtype=torch.float64)
        dist.all_reduce(values)
        total = float(values[-1])
        reduced = {name: float(values[i]) / max(total, 1.0) for i, name in enumerate(names)}
        return {**reduced, "num_tokens": total}

    def _apply(self, loss: torch.Tensor, lr: float, finite: bool = True) -> float:
        """Backward + clip + step; returns the grad norm (non-finite means skipped).

        ``finite`` is False when some rank's loss was non-finite (:meth:`_reduce_loss`).
        """
        self._optimizer.zero_grad(set_to_none=True)
        if not (finite and torch.isfinite(loss)):
            if self._world > 1:  # DDP expects a backward after each forward: run it, drop it
                (loss * 0.0).backward()
                self._optimizer.zero_grad(set_to_none=True)
            logger.warning("[train] non-finite loss, step skipped step=%d", self._num_steps)
            return math.nan
        loss.backward()
        return self._clip_and_step(lr)

    def _clip_and_step(self, lr: float) -> float:
        """Clip the gradients in place and step; nan (and no step) when non-finite."""
        parameters = self._model.parameters()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, self._max_grad_norm))
        if not math.isfinite(grad_norm):
            self._optimizer.zero_grad(set_to_none=True)
            logger.warning("[train] non-finite grad norm, step skipped step=%d", self._num_steps)
            return math.nan
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()
        self._num_steps += 1
        return grad_norm


_CKPT_MODEL = "model.safetensors"
_CKPT_OPTIMIZER = "optimizer.pt"
_CKPT_RNG = "rng.pt"


def _sft_learning_rate(step: int, num_steps: int, peak_lr: float) -> float:
    """Linear warmup over 5% of the steps, then linear decay to 10% of the peak."""
    warmup_steps = max(1, num_steps // 20)
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, num_steps - warmup_steps)
    return peak_lr * (1.0 - 0.9 * progress)


def _right_pad(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad (token_ids, loss_mask) pairs into ``[B, T]`` ids, attention and loss masks."""
    length = max(len(token_ids) for token_ids, _ in pairs)
    input_ids = torch.full((len(pairs), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(pairs), length), dtype=torch.long)
    loss_mask = torch.zeros((len(pairs), length), dtype=torch.float32)
    for index, (token_ids, mask) in enumerate(pairs):
        input_ids[index, : len(token_ids)] = torch.tensor(token_ids, dtype=torch.long)
        attention_mask[index, : len(token_ids)] = 1
        loss_mask[index, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return input_ids, attention_mask, loss_mask


def _right_pad_floats(rows: Sequence[Sequence[float]]) -> torch.Tensor:
    """Right-pad float rows with 0 into a ``[B, T]`` tensor."""
    length = max(len(row) for row in rows)
    values = torch.zeros((len(rows), length), dtype=torch.float32)
    for index, row in enumerate(rows):
        values[index, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return values
