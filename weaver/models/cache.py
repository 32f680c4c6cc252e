"""Static, preallocated per-sequence state of a target (gpt-fast style): nothing is allocated per decode step.

Attention layers keep K/V in `max_seq_len + max_tree_nodes` slots: committed tokens in [0, seq_len), the N nodes of a
pending verify in the scratch slots [seq_len, seq_len + N) until commit compacts the accepted path (METHOD.md 6).
GDN layers keep the recurrent state and conv window, plus a stash of what commit needs from the last verify
(METHOD.md 7: verify writes no recurrent state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from weaver.tree import Tree


@dataclass
class KVCache:
    """k, v: [B, kv_heads, max_seq_len + max_tree_nodes, head_dim]."""

    k: torch.Tensor
    v: torch.Tensor

    def reset(self) -> None:
        """Nothing to clear: slots at or above seq_len are never read before they are written."""


@dataclass
class GDNCache:
    """Recurrent state of one Gated DeltaNet layer and the stash of the last verify.

    conv: [B, C, W-1] last W-1 conv inputs (oldest first), C = 2 H K + HV V. state: [B, HV, K, V] fp32.
    Stash over the N <= max_tree_nodes nodes of a verify: k [B, N, H, K], v [B, N, HV, V], g, beta [B, N, HV],
    x [B, N, C] (conv inputs).
    """

    conv: torch.Tensor
    state: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    x: torch.Tensor

    def reset(self) -> None:
        self.conv.zero_()
        self.state.zero_()


@dataclass
class Cache:
    """All layers' state for `batch_size` sequences of equal length; verify/commit work on batch size 1."""

    layers: list[KVCache | GDNCache]
    max_seq_len: int
    max_tree_nodes: int
    batch_size: int
    seq_len: int = 0
    pending: Tree | None = None  # the tree of a verify not yet committed

    def reset(self) -> None:
        """Empty the cache for a new sequence."""
        for layer in self.layers:
            layer.reset()
        self.seq_len = 0
        self.pending = None

    def discard_pending(self) -> None:
        """Drop the last verify without committing (its scratch K/V and stash are simply overwritten later)."""
        self.pending = None


@dataclass(frozen=True)
class Pass:
    """How one forward call touches the cache: the same for every layer of that call.

    start: first slot written (the committed length seq_len). mask: [T, start + T] bool attention mask over slots
    (True = attend), None when every slot below start + T is visible (one-token decode, or causal without a cache).
    parents: [N] int64 tree parents for a verify, None for a chain of new tokens.
    """

    start: int
    mask: torch.Tensor | None
    parents: torch.Tensor | None
