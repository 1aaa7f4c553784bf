"""The PPO-clip loss used by the trainer backend (GRPO advantages are computed before
any tensor exists, by ``services/trainer/grpo.py``, and arrive with each sample).

Every function is a small formula over tensors so that it can be checked against
hand-computed values; ``torch_backend`` composes them into a training step.
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def kl_estimate(log_ratio: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate ``(ratio - 1) - log ratio`` (non-negative, unbiased "k3")."""
    return torch.expm1(log_ratio) - log_ratio


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss and a mask of tokens where clipping was active.

    Returns:
        ``(loss, is_clipped)`` with ``loss = -min(ratio * A, clip(ratio) * A)``.
    """
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def behaviour_weights(
    proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, is_cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-PPO importance weights ``min(exp(proximal - behaviour), is_cap)``.

    A token sampled by an older policy (the rollout's behaviour policy) is re-weighted
    towards the proximal policy (the trainer's weights before the update), as in AReaL's
    decoupled objective. Truncating at ``is_cap`` bounds the variance a very unlikely
    behaviour token can inject. No gradient flows through the weights.

    Returns:
        ``(weights, is_truncated)``, both ``[B, T]``.
    """
    raw = torch.exp(proximal_logprobs.detach() - behaviour_logprobs.detach())
    return torch.clamp(raw, max=is_cap), raw > is_cap


def ppo_clip_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    behaviour_logprobs: torch.Tensor | None = None,
    is_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean decoupled PPO-clip loss over masked tokens, plus a KL penalty.

    Per token: ``w * -min(r * A, clip(r, 1-eps, 1+eps) * A) + kl_coef * kl(r)`` where
    ``r = exp(new - old)`` (``old`` is the proximal policy: log-probs the trainer
    recomputed before the update) and ``w = min(exp(old - behaviour), is_cap)`` (1 when
    ``is_cap`` is None). The KL estimate is taken against the proximal policy.

    Args:
        new_logprobs: ``[B, T]`` log-probs under the model being optimised (with grad).
        old_logprobs: ``[B, T]`` proximal log-probs the ratio is taken against.
        advantages: ``[B]`` per-trajectory or ``[B, T]`` per-token advantages.
        loss_mask: ``[B, T]``, 1 on policy-generated tokens.
        clip_eps: PPO clip range.
        kl_coef: Weight of the per-token KL estimate against the proximal policy.
        behaviour_logprobs: ``[B, T]`` log-probs reported by the rollout engine (the
            policy that sampled each token); feed the drift metric and, with
            ``is_cap``, the importance weights.
        is_cap: Truncation of the behaviour importance weights; None disables the
            correction (plain PPO against the proximal policy).

    Returns:
        ``(loss, metrics)`` with metrics ``clip_fraction``, ``approx_kl`` and, when
        behaviour log-probs are given, ``logprob_drift`` (mean ``|behaviour - proximal|``)
        and, with ``is_cap``, ``is_weight_mean`` and ``is_truncated_fraction``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1).expand_as(new_logprobs)
    log_ratio = new_logprobs - old_logprobs.detach()
    surrogate, is_clipped = clipped_surrogate(torch.exp(log_ratio), advantages, clip_eps)
    metrics: dict[str, float] = {}
    if behaviour_logprobs is not None and is_cap is not None:
        weights, is_truncated = behaviour_weights(old_logprobs, behaviour_logprobs, is_cap)
        surrogate = weights * surrogate
        metrics["is_weight_mean"] = float(masked_mean(weights, loss_mask))
        metrics["is_truncated_fraction"] = float(masked_mean(is_truncated.float(), loss_mask))
    kl = kl_estimate(log_ratio)
    loss = masked_mean(surrogate + kl_coef * kl, loss_mask)
    metrics["clip_fraction"] = float(masked_mean(is_clipped.float(), loss_mask))
    metrics["approx_kl"] = float(masked_mean(kl.detach(), loss_mask))
    if behaviour_logprobs is not None:
        drift = (behaviour_logprobs - old_logprobs.detach()).abs()
        metrics["logprob_drift"] = float(masked_mean(drift, loss_mask))
    return loss, metrics
