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

Device and precision: one device (CUDA when visible, else CPU, unless told); the forward
passes, their precision and the PPO loss are ``policy_forward.PolicyForward``'s.
Parameters and AdamW states are always float32 (master weights): a model handed over in
bfloat16 is upcast once, because AdamW steps at RL learning rates (~1e-6) are far below a
bfloat16 ulp and would be lost. :meth:`save_weights` publishes in the dtype the model
came in (what the engines load), checkpoints keep float32.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from libra.models.hf import default_device
from libra.training import weight_files
from libra.training.loss import masked_mean
from libra.training.parallel import (
    PARALLELISMS,
    broadcast_from_rank0,
    fully_shard_layers,
    max_over_ranks,
    reduce_loss,
    reduce_metrics,
    same_optimizer_over,
)
from libra.training.policy_forward import PolicyForward, PolicyLoss, floating_dtype
from libra.training.samples import SftExample, TrainSample
from libra.training.tensors import right_pad

logger = logging.getLogger(__name__)


class TorchTrainerBackend:
    """Holds the policy and its AdamW optimizer.

    Args:
        model: The causal LM to train (in place): moved to ``device``, upcast to float32
            master weights when it came in another dtype.
        pad_token_id: Token used to right-pad batches (masked out everywhere).
        seed: Seeds torch and the SFT batch sampler, so runs are reproducible.
        learning_rate: Default learning rate of :meth:`train_step`.
        weight_decay: AdamW weight decay.
        max_grad_norm: Global grad-norm clip.
        num_threads: ``torch.set_num_threads`` value.
        device: ``cpu``, ``cuda`` or ``cuda:<n>``; None: CUDA when visible, else CPU.
        gradient_checkpointing: Recompute each decoder layer's activations in backward
            (``model.gradient_checkpointing_enable``): less memory, ~1/3 more compute.
        micro_batch_size: Sequences per forward/backward of a PPO step on one rank (0: the
            whole batch); gradients accumulate, so the update is the same, and the
            activations (the ``[B, T, vocab]`` logits above all) of only that many
            sequences are held at once.
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
        device: str | None = None,
        gradient_checkpointing: bool = False,
        micro_batch_size: int = 0,
    ) -> None:
        torch.set_num_threads(num_threads)
        self._micro_batch_size = micro_batch_size
        torch.manual_seed(seed)
        self._model = model
        self._publish_dtype = floating_dtype(model)
        if self._publish_dtype != torch.float32:
            logger.info("[train] %s model upcast to float32 master weights", self._publish_dtype)
            model.float()
        self._fwd = PolicyForward(model, pad_token_id, self._publish_dtype,
                                  device if device is not None else default_device())
        if gradient_checkpointing:
            # Non-reentrant: works under DDP/FSDP2 and with inputs that need no grad.
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self._learning_rate = learning_rate
        self._max_grad_norm = max_grad_norm
        self._rng = random.Random(seed)
        self._optimizer = torch.optim.AdamW(
            model.parameters(), lr=learning_rate, weight_decay=weight_decay
        )
        self._num_steps = 0
        # Data parallel (enable_data_parallel): this rank and the group size.
        self._rank = 0
        self._world = 1

    @property
    def device(self) -> torch.device:
        """Where the model and every batch tensor live."""
        return self._fwd.device

    @property
    def compute_dtype(self) -> torch.dtype:
        """bfloat16 under autocast, else float32 (parameters are float32 either way)."""
        return self._fwd.compute_dtype

    def enable_data_parallel(self, parallelism: str = "ddp", device: str = "cpu") -> None:
        """Join the (initialised) default process group: shard batches, reduce gradients.

        Args:
            parallelism: ``ddp`` (every rank holds the whole model; DDP broadcasts rank 0's
                parameters and all-reduces gradients) or ``fsdp2`` (rank 0's parameters are
                broadcast, then ``fully_shard`` on each decoder layer and the root: each rank
                keeps 1/N of every parameter and of the optimizer state; gradients are
                reduce-scattered). Both average gradients over ranks, so the loss scaling of
                :func:`parallel.reduce_loss` holds for either.
            device: ``cpu`` or ``cuda:<local rank>``: the model moves there (before the
                first step), and so do the batches from then on.
        """
        if parallelism not in PARALLELISMS:
            raise ValueError(f"parallelism must be one of {PARALLELISMS}, got {parallelism!r}")
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        if torch.device(device) != self._fwd.device:
            self._fwd.place(device)
        if parallelism == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            # Buffers (rotary tables) are the same on every rank: synced once at init,
            # not before every forward.
            self._fwd.forward_model = DistributedDataParallel(self._model,
                                                              forward_sync_buffers=False)
            return
        broadcast_from_rank0(self._model)
        fully_shard_layers(self._model, self._fwd.device.type)
        # fully_shard swapped in sharded (DTensor) parameters: the optimizer must hold them.
        self._optimizer = same_optimizer_over(self._optimizer, self._model)

    @property
    def model(self) -> PreTrainedModel:
        """The policy being trained."""
        return self._model

    def sft(
        self, examples: Sequence[SftExample], num_steps: int, batch_size: int, lr: float,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> list[float]:
        """Supervised warm start: token-mean cross-entropy on masked (trainable) tokens.

        The learning rate warms up linearly over the first 5% of steps and then decays
        linearly to 10% of ``lr``: a short, high-LR run reaches a much lower loss this way
        than at a constant rate, which matters on a 60-second CPU budget.

        ``should_stop`` is asked before every step (a cancelled job's warm start ends
        there instead of running minutes in its thread).

        Returns:
            The loss of every step taken.
        """
        losses: list[float] = []
        self._model.train()
        for step in range(num_steps):
            if should_stop():
                break
            batch = self._rng.sample(list(examples), k=min(batch_size, len(examples)))
            batch, weight = self._shard(batch)
            padded = right_pad([(example.token_ids, example.loss_mask) for example in batch],
                               self._fwd.pad_token_id)
            num_tokens = float(padded[2].sum())  # on the CPU: no device sync
            input_ids, attention_mask, loss_mask = self._fwd.to_device(*padded)
            logprobs = self._fwd.token_logprobs(input_ids, attention_mask)
            loss = -masked_mean(logprobs, loss_mask)
            loss, loss_value, finite = reduce_loss(loss, num_tokens * weight, self._world)
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
        if self._world == 1 and 0 < self._micro_batch_size < len(samples):
            return self._accumulated_step(samples, lr=lr, clip_eps=clip_eps, kl_coef=kl_coef,
                                          is_cap=is_cap)
        pl = self.policy_loss(samples, clip_eps=clip_eps, kl_coef=kl_coef, is_cap=is_cap)
        loss, metrics, recompute_s, started = pl.loss, pl.metrics, pl.recompute_s, pl.started
        # 3) Backward, clip, step (or skip on a non-finite loss or gradient).
        num_tokens = pl.num_tokens * weight
        loss, loss_value, finite = reduce_loss(loss, num_tokens, self._world)
        grad_norm = self._apply(loss, self._learning_rate if lr is None else lr, finite)
        self._model.eval()
        metrics = reduce_metrics(metrics, num_tokens, self._world)
        metrics.update(
            loss=loss_value,
            grad_norm=grad_norm,
            recompute_s=recompute_s,
            fwd_bwd_s=time.perf_counter() - started,
            is_skipped=float(not math.isfinite(grad_norm)),
        )
        # The slowest rank's times.
        metrics["recompute_s"], metrics["fwd_bwd_s"] = max_over_ranks(
            [recompute_s, metrics["fwd_bwd_s"]], self._world)
        return metrics

    def _accumulated_step(self, samples: Sequence[TrainSample], *, lr: float | None,
                          clip_eps: float, kl_coef: float,
                          is_cap: float | None) -> dict[str, float]:
        """:meth:`train_step` in micro-batches (one rank): each micro-batch's token-mean
        loss weighted by its share of the batch's tokens, so the accumulated gradient is
        the whole batch's; metrics are token-weighted the same way."""
        size = self._micro_batch_size
        total = float(sum(sum(sample.loss_mask) for sample in samples)) or 1.0
        self._optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss": 0.0, "recompute_s": 0.0, "fwd_bwd_s": 0.0}
        finite = True
        for start in range(0, len(samples), size):
            pl = self.policy_loss(samples[start:start + size], clip_eps=clip_eps,
                                  kl_coef=kl_coef, is_cap=is_cap)
            share = pl.num_tokens / total
            finite = finite and bool(torch.isfinite(pl.loss))
            if finite:
                (pl.loss * share).backward()
            for name, value in {**pl.metrics, "loss": float(pl.loss.detach())}.items():
                sums[name] = sums.get(name, 0.0) + value * share
            sums["recompute_s"] += pl.recompute_s
            sums["fwd_bwd_s"] += time.perf_counter() - pl.started
        lr = self._learning_rate if lr is None else lr
        grad_norm = self._clip_and_step(lr) if finite else math.nan
        self._optimizer.zero_grad(set_to_none=True)
        self._model.eval()
        return {**sums, "num_tokens": total, "grad_norm": grad_norm,
                "is_skipped": float(not math.isfinite(grad_norm))}

    def policy_loss(self, samples: Sequence[TrainSample], *, clip_eps: float,
                    kl_coef: float, is_cap: float | None) -> PolicyLoss:
        """The decoupled PPO-clip loss of ``samples`` (see :meth:`PolicyForward.policy_loss`)."""
        return self._fwd.policy_loss(samples, clip_eps=clip_eps, kl_coef=kl_coef,
                                     is_cap=is_cap)

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
        # On the CPU: the gradients travel (safetensors bytes) to the other workers.
        grads = {name: (p.grad.detach().cpu().clone() if p.grad is not None and finite
                        else torch.zeros_like(p, device="cpu"))
                 for name, p in self._model.named_parameters()}
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
            param.grad = grads[name].to(param.device, param.dtype, copy=True)
        return self._clip_and_step(lr)

    def save_weights(self, path: str) -> str:
        """Publish the weights as safetensors; returns the file's sha256 hex digest.

        The published format (``libra.training.tensors``): the HF model's state-dict
        names, each tensor once (a tied ``lm_head.weight`` is left out), in the dtype the
        model came in. Under FSDP2 every rank must call this (the full state dict is
        gathered); only rank 0 writes, the other ranks return ``""``.

        Raises:
            ValueError: A tensor holds a non-finite value (never publish NaN weights).
        """
        return weight_files.publish_weights(self._model, self._publish_dtype, self._rank, path)

    def load_weights(self, path: str) -> None:
        """Load a file written by :meth:`save_weights` (optimizer kept).

        Raises:
            ValueError: A missing, unexpected or mis-shaped key (named); nothing loaded.
        """
        weight_files.load_weights(self._model, path)

    def save_checkpoint(self, directory: str) -> list[str]:
        """Write model, optimizer and RNG state into ``directory``; returns the file names.

        See :func:`parallel.write_checkpoint` (whole states, so a checkpoint loads into 1
        rank, DDP or FSDP2 alike; with several ranks every rank must call this).
        """
        return weight_files.save_state(directory, self._model, self._optimizer, self._rng,
                                       self._num_steps, self.device, self._rank)

    def load_checkpoint(self, directory: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (every rank reads the same files).

        Raises:
            ValueError: A file is unreadable or does not fit the model; names the file.
        """
        self._num_steps = weight_files.load_state(directory, self._model, self._optimizer,
                                                  self._rng, self.device)

    def _shard(self, items: Sequence) -> tuple[list, float]:
        """This rank's stride of ``items`` and its weight (0.0: a stand-in, counts nothing).

        A rank left without items runs the first one with weight 0 so that every rank
        still takes part in the gradient all-reduce.
        """
        if self._world == 1:
            return list(items), 1.0
        shard = list(items[self._rank::self._world])
        return (shard, 1.0) if shard else (list(items[:1]), 0.0)

    def _apply(self, loss: torch.Tensor, lr: float, finite: bool = True) -> float:
        """Backward + clip + step; returns the grad norm (non-finite means skipped).

        ``finite`` is False when some rank's loss was non-finite (``reduce_loss``).
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


def _sft_learning_rate(step: int, num_steps: int, peak_lr: float) -> float:
    """Linear warmup over 5% of the steps, then linear decay to 10% of the peak."""
    warmup_steps = max(1, num_steps // 20)
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, num_steps - warmup_steps)
    return peak_lr * (1.0 - 0.9 * progress)
