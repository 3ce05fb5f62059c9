"""PPO's maths on fixed tensors, against hand computation and a plain reference implementation."""

import doctest

import pytest
import torch

from posttrain.entrypoints.trainers import ppo_math
from posttrain.entrypoints.trainers.ppo_math import (
    adapted_kl_coef,
    gae,
    kl_per_token,
    masked_mean,
    policy_loss,
    until_first,
    value_loss,
    whiten,
)


def test_ppo_math_doctests() -> None:
    assert doctest.testmod(ppo_math).failed == 0


def test_gae_matches_a_hand_computed_case() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 0.6, 9.0]])
    # the last position is padding
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    gamma, lam = 0.9, 0.5
    # by hand, backwards; V after the last real token is 0 and padding is ignored
    d2 = 1.0 + gamma * 0.0 - 0.6
    d1 = 0.0 + gamma * 0.6 - 0.4
    d0 = 0.0 + gamma * 0.4 - 0.2
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    expected = torch.tensor([[a0, a1, a2, 0.0]])
    assert torch.allclose(gae(rewards, values, mask, gamma, lam), expected)


def test_gae_with_gamma_and_lambda_one_is_reward_to_go_minus_value() -> None:
    rewards = torch.tensor([[0.1, -0.2, 0.3]])
    values = torch.tensor([[0.5, 0.1, -0.4]])
    advantages = gae(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    to_go = torch.tensor([[0.2, 0.1, 0.3]])
    assert torch.allclose(advantages, to_go - values)


def test_clipped_policy_loss_against_a_reference_computation() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5]])
    new = torch.tensor([[-0.5, -2.5, -0.5, -1.0]])
    advantages = torch.tensor([[1.0, -1.0, 2.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    eps = 0.2
    loss, clipfrac = policy_loss(new, old, advantages, mask, eps)
    terms, clipped_count = [], 0
    # the masked position is left out
    for i in range(3):
        ratio = torch.exp(new[0, i] - old[0, i]).item()
        a = advantages[0, i].item()
        unclipped, clipped = -a * ratio, -a * min(max(ratio, 1 - eps), 1 + eps)
        terms.append(max(unclipped, clipped))
        clipped_count += clipped > unclipped
    assert loss.item() == pytest.approx(sum(terms) / 3)
    assert clipfrac.item() == pytest.approx(clipped_count / 3)


def test_clipped_value_loss_against_a_reference_computation() -> None:
    values = torch.tensor([[1.0, 0.0, 2.0]])
    old = torch.tensor([[0.5, 0.5, 1.9]])
    returns = torch.tensor([[0.0, 1.0, 2.0]])
    loss, _ = value_loss(values, old, returns, torch.ones(1, 3), 0.2)
    expected = 0
    for v, o, r in zip(values[0].tolist(), old[0].tolist(), returns[0].tolist()):
        clipped = o + min(max(v - o, -0.2), 0.2)
        expected += 0.5 * max((v - r) ** 2, (clipped - r) ** 2)
    assert loss.item() == pytest.approx(expected / 3)


def test_kl_estimators() -> None:
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    assert torch.allclose(kl_per_token(logp, ref, "k1"), logp - ref)
    q = torch.exp(ref - logp)
    assert torch.allclose(kl_per_token(logp, ref, "k3"), (q - 1) - torch.log(q))
    assert (kl_per_token(logp, ref, "k3") >= 0).all()
    assert kl_per_token(logp, logp, "k3").abs().max() == 0


def test_adaptive_kl_controller_moves_towards_the_target_within_its_clip() -> None:
    assert adapted_kl_coef(0.1, kl=12.0, target=6.0, samples=100, horizon=1000) == pytest.approx(0.1 * 1.02)
    assert adapted_kl_coef(0.1, kl=3.0, target=6.0, samples=100, horizon=1000) == pytest.approx(0.1 * 0.98)


def test_responses_are_cut_after_the_first_eos() -> None:
    eos = 9
    tokens = torch.tensor([[5, 9, 4, 9], [1, 2, 3, 4], [9, 1, 1, 1]])
    assert until_first(tokens, eos).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])).item() == 2.0


def test_whitening_is_over_the_real_tokens_of_every_rank() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    one_rank = whiten(values, mask, lambda stats: stats)
    assert one_rank[0, 3] == 0 and masked_mean(one_rank, mask).abs() < 1e-6
    assert masked_mean(one_rank**2, mask).item() == pytest.approx(1.0, abs=1e-6)
    # two ranks holding the same tokens: the same statistics
    assert torch.allclose(whiten(values, mask, lambda stats: 2 * stats), one_rank)
