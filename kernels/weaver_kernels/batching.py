"""Optional leading batch dim for single-sequence references."""

from __future__ import annotations

import functools

import torch


def batched(*ranks: int):
    """Let a single-sequence reference take an optional leading batch dim B.

    `ranks` gives each positional argument's rank in the single-sequence form. The first argument decides: at its own
    rank the call is one sequence, one rank above it is a batch of B. Then every tensor argument one rank above its
    single-sequence rank is indexed by the batch item (q [B, N, H, K], parents [B, N], leaf [B]); every other argument
    (parents [N] shared by the batch, weights, ints, keywords) is passed unchanged.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if args[0].dim() == ranks[0]:
                return fn(*args, **kwargs)

            def item(b: int) -> list:
                return [
                    a[b] if isinstance(a, torch.Tensor) and i < len(ranks) and a.dim() == ranks[i] + 1 else a
                    for i, a in enumerate(args)
                ]

            items = [fn(*item(b), **kwargs) for b in range(args[0].shape[0])]
            if isinstance(items[0], tuple):
                return tuple(torch.stack(x) for x in zip(*items, strict=True))
            return torch.stack(items)

        return wrapper

    return decorate
