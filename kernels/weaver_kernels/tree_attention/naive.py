"""PyTorch reference for tree attention in verify (METHOD.md section 6).

N tree tokens attend to the whole committed prefix (T tokens) and to their ancestors-or-self in the tree. GQA: HQ query
heads share HKV key/value heads (HQ % HKV == 0).
"""

from __future__ import annotations

import torch

from weaver_kernels.batching import batched
from weaver_kernels.gdn_tree.naive import ancestor_masks


@batched(3, 3, 3, 3, 3, 1)
def tree_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    parents: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention of tree tokens over committed prefix + ancestor-or-self block.

    Args:
        q: [N, HQ, D] tree queries (RoPE applied at positions seq_len + depth). k, v: [N, HKV, D] tree keys / values.
        k_prefix, v_prefix: [T, HKV, D] committed cache (T may be 0). parents: [N] int64, parents[0] = -1.
        scale: softmax scale, default D^-1/2.
    Returns:
        o: [N, HQ, D]; o_i depends on the prefix and on the nodes of the path root..i only.
    """
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    keys = torch.cat([k_prefix, k]).to(acc).repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # [HQ, T+N, D]
    vals = torch.cat([v_prefix, v]).to(acc).repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
    _, anc_self = ancestor_masks(parents)
    visible = torch.cat([anc_self.new_ones(q.shape[0], k_prefix.shape[0]), anc_self], dim=1)  # [N, T+N]
    scores = q.to(acc).transpose(0, 1) @ keys.transpose(1, 2) * (d**-0.5 if scale is None else scale)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)  # the diagonal keeps every row finite
    return (probs @ vals).transpose(0, 1).to(q.dtype)
