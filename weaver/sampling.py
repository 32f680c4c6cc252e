"""The target distribution that lossless sampling reproduces, and the one random draw every verifier makes.

Losslessness (METHOD.md section 5) is relative to the FILTERED target: temperature, then top-k, then top-p, then
renormalise. `target_probs` computes it; `Chooser` is the only source of randomness in acceptance, so that tests
can replace it with a scripted chooser and enumerate every random decision exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How the target samples. temperature 0 means greedy (argmax); top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables top-k filtering), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1] (1 disables nucleus filtering), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_logits(logits: torch.Tensor) -> None:
    """Raise ValueError if `logits` [N, V] holds NaN or +inf, or a row that is -inf everywhere (no distribution)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, V], got {tuple(logits.shape)}")
    row_max = logits.amax(-1)  # one pass: amax propagates NaN, is +inf on +inf rows and -inf on all -inf rows
    if torch.isfinite(row_max).all():
        return
    if torch.isnan(row_max).any():
        rows = torch.isnan(row_max).nonzero().flatten().tolist()
        raise ValueError(f"logits contain NaN in rows {rows}: the target's forward pass is broken (check dtype/masks)")
    if torch.isposinf(row_max).any():
        rows = torch.isposinf(row_max).nonzero().flatten().tolist()
        raise ValueError(f"logits contain +inf in rows {rows}: a distribution needs finite logits (or -inf to forbid)")
    raise ValueError(
        f"logits rows {torch.isneginf(row_max).nonzero().flatten().tolist()} are -inf everywhere: no token is allowed "
        "there (check the vocabulary mask / padding)"
    )


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The filtered target distribution, in float64.

    Args:
        logits: [N, V] raw target logits; -inf forbids a token; NaN, +inf and all -inf rows raise ValueError.
        params: temperature, then top-k (ties with the k-th logit are kept), then top-p (the smallest prefix of the
            sorted distribution whose mass reaches top_p), then renormalise. Temperature 0 gives the one-hot argmax.

    Returns:
        probs: [N, V] float64, rows sum to 1; filtered-out tokens get exactly 0.
    """
    check_logits(logits)
    x = logits.to(torch.float64)
    if params.greedy:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(torch.float64)
    x = x / params.temperature
    if 0 < params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, -math.inf)
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (the first token always stays)
        drop_sorted = (torch.cumsum(sorted_probs, -1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class Chooser(Protocol):
    """The source of every random decision in acceptance."""

    def choose(self, weights: torch.Tensor) -> int:
        """Return index i of `weights` [K] (>= 0, positive sum) with probability weights[i] / weights.sum()."""
        ...


class GeneratorChooser:
    """Draws by inverting the CDF of the weights with one uniform from a seeded torch.Generator."""

    def __init__(self, generator: torch.Generator) -> None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"sampling needs an explicit seeded torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    def choose(self, weights: torch.Tensor) -> int:
        cdf = torch.cumsum(weights.to("cpu", torch.float64), 0)
        u = torch.rand((), generator=self.generator, dtype=torch.float64, device=self.generator.device).item()
        i = int(torch.searchsorted(cdf, u * cdf[-1].item(), right=True))
        # u * total can round up to total; fall back to the last index that carries weight (never a zero one)
        return min(i, int((weights > 0).nonzero()[-1]))
