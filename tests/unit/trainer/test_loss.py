"""Unit tests for the PPO-clip loss and its parts, against hand-computed values
(GRPO advantages: tests/unit/trainer/test_grpo.py)."""

import math

import pytest
import torch

from libra.training.loss import (
    behaviour_weights,
    kl_estimate,
    masked_mean,
    ppo_clip_loss,
)


def test_masked_mean_ignores_masked_positions_and_handles_empty_masks():
    values = torch.tensor([[1.0, 2.0, 100.0]])
    assert masked_mean(values, torch.tensor([[1, 1, 0]])).item() == 1.5
    assert masked_mean(values, torch.zeros(1, 3)).item() == 0.0


def test_ppo_clip_loss_clips_positive_advantage_above_one_plus_eps():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.9]]))
    loss, metrics = ppo_clip_loss(new, old, torch.tensor([2.0]), torch.ones(1, 2), clip_eps=0.2)
    # Token 1: min(1.5*2, 1.2*2) = 2.4. Token 2: min(0.9*2, 0.9*2) = 1.8. Mean of -x.
    assert loss.item() == pytest.approx(-(2.4 + 1.8) / 2, rel=1e-5)
    assert metrics["clip_fraction"] == pytest.approx(0.5)


def test_ppo_clip_loss_clips_negative_advantage_below_one_minus_eps():
    new = torch.log(torch.tensor([[0.5, 1.5]]))
    loss, metrics = ppo_clip_loss(new, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
    # Token 1: min(-0.5, -0.8) = -0.8 (clipped). Token 2: min(-1.5, -1.2) = -1.5.
    assert loss.item() == pytest.approx((0.8 + 1.5) / 2, rel=1e-5)
    assert metrics["clip_fraction"] == pytest.approx(0.5)


def test_ppo_clip_loss_masks_tokens_and_adds_kl_penalty():
    new = torch.log(torch.tensor([[2.0, 1.0, 7.0]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = ppo_clip_loss(
        new,
        torch.zeros(1, 3),
        torch.tensor([0.0]),
        mask,
        kl_coef=0.5,
        behaviour_logprobs=torch.tensor([[0.1, -0.3, 9.0]]),
    )
    kl_first = (2.0 - 1.0) - math.log(2.0)
    assert metrics["approx_kl"] == pytest.approx(kl_first / 2, rel=1e-5)
    assert loss.item() == pytest.approx(0.5 * kl_first / 2, rel=1e-5)
    assert metrics["logprob_drift"] == pytest.approx(0.2, rel=1e-5)


def test_ppo_clip_loss_gradient_is_policy_gradient_at_ratio_one():
    new = torch.zeros(1, 2, requires_grad=True)
    loss, _ = ppo_clip_loss(new, torch.zeros(1, 2), torch.tensor([[1.0, -3.0]]), torch.ones(1, 2))
    loss.backward()
    assert new.grad[0].tolist() == pytest.approx([-0.5, 1.5])


def test_kl_estimate_is_zero_at_equal_policies_and_positive_elsewhere():
    values = kl_estimate(torch.tensor([0.0, 0.5, -0.5]))
    assert values[0].item() == 0.0 and (values[1:] > 0).all()


def test_behaviour_weights_are_proximal_over_behaviour_truncated_at_the_cap():
    proximal = torch.log(torch.tensor([[0.5, 0.9, 0.5]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.6, 0.1]]))
    weights, truncated = behaviour_weights(proximal, behaviour, is_cap=2.0)
    # 0.5/0.25 = 2 (at the cap, not over it), 0.9/0.6 = 1.5, 0.5/0.1 = 5 -> 2.
    assert weights[0].tolist() == pytest.approx([2.0, 1.5, 2.0], rel=1e-5)
    assert truncated[0].tolist() == [False, False, True]


def test_decoupled_loss_weights_each_token_by_its_truncated_importance_weight():
    proximal = torch.log(torch.tensor([[0.5, 0.9, 0.5]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.6, 0.1]]))
    loss, metrics = ppo_clip_loss(proximal.clone(), proximal, torch.tensor([1.0]),
                                  torch.ones(1, 3), behaviour_logprobs=behaviour, is_cap=2.0)
    # Ratio new/proximal is 1 everywhere: the token loss is -w * A = -w.
    assert loss.item() == pytest.approx(-(2.0 + 1.5 + 2.0) / 3, rel=1e-5)
    assert metrics["is_weight_mean"] == pytest.approx(5.5 / 3, rel=1e-5)
    assert metrics["is_truncated_fraction"] == pytest.approx(1 / 3, rel=1e-5)
    assert metrics["logprob_drift"] == pytest.approx(
        (math.log(2.0) + math.log(1.5) + math.log(5.0)) / 3, rel=1e-5)


def test_decoupled_loss_clips_the_ratio_to_the_proximal_policy_not_the_behaviour():
    proximal = torch.zeros(1, 1)
    behaviour = torch.log(torch.tensor([[0.5]]))  # w = exp(0 - log 0.5) = 2
    new = torch.log(torch.tensor([[1.5]]))  # ratio to proximal 1.5 -> clipped to 1.2
    loss, metrics = ppo_clip_loss(new, proximal, torch.tensor([2.0]), torch.ones(1, 1),
                                  behaviour_logprobs=behaviour, is_cap=4.0)
    assert loss.item() == pytest.approx(-2.0 * min(1.5 * 2.0, 1.2 * 2.0), rel=1e-5)
    assert metrics["clip_fraction"] == 1.0


def test_decoupled_loss_gradient_is_weighted_policy_gradient_and_kl_is_unweighted():
    proximal = torch.zeros(1, 2)
    behaviour = torch.log(torch.tensor([[0.5, 1.0]]))  # weights 2 and 1
    new = torch.zeros(1, 2, requires_grad=True)
    loss, _ = ppo_clip_loss(new, proximal, torch.tensor([1.0]), torch.ones(1, 2),
                            kl_coef=0.5, behaviour_logprobs=behaviour, is_cap=2.0)
    loss.backward()
    # d/dnew of -w * exp(new - prox) * A at new = prox is -w * A, over 2 tokens; the KL
    # term (ratio - 1) - log ratio has zero gradient at ratio 1.
    assert new.grad[0].tolist() == pytest.approx([-1.0, -0.5])


def test_without_a_cap_behaviour_log_probs_only_measure_drift():
    proximal = torch.zeros(1, 1)
    loss, metrics = ppo_clip_loss(proximal.clone(), proximal, torch.tensor([1.0]),
                                  torch.ones(1, 1), behaviour_logprobs=torch.tensor([[-3.0]]))
    assert loss.item() == pytest.approx(-1.0)
    assert "is_weight_mean" not in metrics
    assert metrics["logprob_drift"] == pytest.approx(3.0)
