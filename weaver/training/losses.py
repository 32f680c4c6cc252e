"""Loss helpers shared by drafter and adapter training (METHOD.md sections 2 and 3).

The target's distribution is stored sparsely (its top-k token ids and log-probs per position, see features.py), so
the losses take `(target_ids [N, k], target_logprobs [N, k])` and never need a [N, V] target tensor.
"""

from __future__ import annotations

import torch


def position_decay(num_positions: int, gamma: float) -> torch.Tensor:
    """Weights [num_positions] exp(-(d - 1) / gamma) for block depths d = 1..D (DFlash's exponential decay).

    Early depths dominate acceptance (a chain stops at its first miss), so they weigh most; gamma 4-7 in the paper.
    """
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    return torch.exp(-torch.arange(num_positions, dtype=torch.float32) / gamma)


def renormalized_target(target_logprobs: torch.Tensor) -> torch.Tensor:
    """Target probs [N, k] over its stored top-k, renormalised to sum to 1 (-inf entries get 0)."""
    return torch.softmax(target_logprobs.float(), dim=-1)


def sparse_kl(logits: torch.Tensor, target_ids: torch.Tensor, target_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-row KL(p_target || q) [N] with p = the target's top-k renormalised, q = softmax(logits [N, V]).

    Tokens outside the target's top-k carry p = 0 and so contribute nothing; q keeps its full-vocabulary normaliser.
    """
    p = renormalized_target(target_logprobs)
    log_q = torch.log_softmax(logits.float(), dim=-1).gather(-1, target_ids.long())
    log_p = torch.log(p.clamp_min(1e-30))
    return (p * (log_p - log_q)).sum(-1)


def argmax_cross_entropy(logits: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Per-row cross-entropy [N] of logits [N, V] against the target's argmax (target_ids[:, 0], top-k sorted)."""
    return torch.nn.functional.cross_entropy(logits.float(), target_ids[:, 0].long(), reduction="none")


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum(w * v) / sum(w) over rows; 0 (with a gradient path) when every weight is 0."""
    return (values * weights).sum() / weights.sum().clamp_min(1e-8)
