"""PPO's maths on tensors: advantages, losses, KL estimates and control, whitening.

Pure functions of their arguments (``[batch, time]`` tensors over response
tokens, with a mask marking the real ones), tested against hand computation
in ``tests/unit/trainers/test_ppo_math.py``; :mod:`posttrain.entrypoints.trainers.ppo_trainer` runs
them inside its loop.
"""

import math
from typing import Callable, Tuple

import torch
import torch.nn.functional as F


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over response tokens (``[batch, time]``).

    ``mask`` marks real tokens; padding comes only after them, has reward and
    value 0, so the value after the last real token is 0.

    >>> gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), 1.0, 1.0)
    tensor([[0.5000, 0.7500]])
    """
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        next_value = values[:, t + 1] if t + 1 < rewards.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    return advantages * mask


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over the real tokens."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate ``max(-A ρ, -A clip(ρ, 1-ε, 1+ε))`` and the clipped fraction."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    return masked_mean(torch.max(unclipped, clipped), mask), masked_mean((clipped > unclipped).float(), mask)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``½ max((V - R)², (clip(V, V_old ± ε) - R)²)`` and the clipped fraction."""
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_error, clipped_error = (values - returns) ** 2, (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped_error, clipped_error), mask)
    return loss, masked_mean((clipped_error > unclipped_error).float(), mask)


def kl_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Schulman's k1 (``logp - logp_ref``) or k3 (``(q - 1) - log q``, ``q = p_ref / p``)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    return torch.expm1(-log_ratio) + log_ratio


def adapted_kl_coef(kl_coef: float, kl: float, target: float, samples: int, horizon: int) -> float:
    """Ziegler et al.'s controller: ``β (1 + clip(KL/target - 1, ±0.2) n / horizon)``."""
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * samples / horizon)


def until_first(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS of each row (all of it where there is none), else 0."""
    is_eos = tokens == eos_id
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos).long()


def whiten(
    values: torch.Tensor, mask: torch.Tensor, reduce_sum: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Zero mean, unit variance over the real tokens; ``reduce_sum`` adds the statistics of every rank."""
    stats = torch.stack([(values * mask).sum(), (values**2 * mask).sum(), mask.sum()])
    total, total_sq, count = reduce_sum(stats).tolist()
    mean = total / max(count, 1.0)
    variance = max(total_sq / max(count, 1.0) - mean**2, 0.0)
    return (values - mean) / math.sqrt(variance + 1e-8) * mask


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding, as ``generate`` computes them."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def response_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, prompt_length: int, temperature: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the response tokens at the sampling temperature, and the entropy."""
    response_logits = logits[:, prompt_length - 1 : -1].float() / temperature
    log_probs = F.log_softmax(response_logits, dim=-1)
    chosen = torch.gather(log_probs, 2, tokens[:, prompt_length:].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return chosen, entropy
