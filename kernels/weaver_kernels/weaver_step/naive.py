"""PyTorch references for the Weaver adapter's node-expansion step (METHOD.md section 3).

A step expands W new tree nodes at once. In every adapter layer each node's query attends to all C = 1 + D context
tokens, to the cached K/V of its proper ancestors and to itself; the caller writes the new nodes' K/V into the node
cache first, so "ancestors and self" is one list of node slots per node. After the last layer the node's query
q = out_norm(h) scores its next-depth candidate pool against the precomputed [V, d_rank] residual table:
logit(c) = s(c) + residual[c] . q; no [.., V] tensor is formed.
"""

from __future__ import annotations

import torch

from weaver_kernels.batching import batched


def check_attention_shapes(q, ctx_k, ctx_v, node_k, node_v, slots) -> None:
    """Shape errors that name the mismatch; single-sequence or batched (leading B) shapes."""
    lead = q.dim() - 3
    if ctx_k.shape != ctx_v.shape or node_k.shape != node_v.shape:
        raise ValueError(
            f"keys and values differ: ctx {ctx_k.shape} vs {ctx_v.shape}, nodes {node_k.shape} vs {node_v.shape}"
        )
    if ctx_k.shape[lead] < 1:
        raise ValueError("the adapter context needs at least one token (1 + D: the target's hidden and each depth)")
    if q.shape[-1] != ctx_k.shape[-1] or q.shape[-1] != node_k.shape[-1]:
        raise ValueError(f"head dims differ: q {q.shape}, context {ctx_k.shape}, nodes {node_k.shape}")
    if q.shape[-2] % ctx_k.shape[-2] or ctx_k.shape[-2] != node_k.shape[-2]:
        raise ValueError(f"query heads {q.shape[-2]} must be a multiple of the key/value heads {ctx_k.shape[-2]}")
    if slots.dtype != torch.long or slots.shape[: lead + 1] != q.shape[: lead + 1]:
        raise ValueError(
            f"slots must be int64 [.., W, A] matching q {tuple(q.shape)}, got {slots.dtype} {tuple(slots.shape)}"
        )


@batched(3, 3, 3, 3, 3, 2)
def weaver_step_attention_ref(
    q: torch.Tensor,
    ctx_k: torch.Tensor,
    ctx_v: torch.Tensor,
    node_k: torch.Tensor,
    node_v: torch.Tensor,
    slots: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of W new nodes over the whole context plus their own node slots.

    Args:
        q: [W, HQ, Dh] queries of the new nodes (RoPE applied at depth + 1).
        ctx_k, ctx_v: [C, HKV, Dh] the context tokens' K/V (C = 1 + D >= 1, keys rotated at positions 0..D).
        node_k, node_v: [M, HKV, Dh] the node cache (M slots), the new nodes' own K/V already written.
        slots: [W, A] int64 node slots each node sees (its ancestors and itself), -1 = padding; A may be 0.
        scale: softmax scale, default Dh^-1/2.
    Returns:
        o: [W, HQ, Dh] in q's dtype.
    """
    check_attention_shapes(q, ctx_k, ctx_v, node_k, node_v, slots)
    w, hq, dh = q.shape
    rep = hq // ctx_k.shape[1]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    gathered_k = node_k[slots.clamp(min=0)]  # [W, A, HKV, Dh]
    gathered_v = node_v[slots.clamp(min=0)]
    keys = torch.cat([ctx_k.expand(w, *ctx_k.shape), gathered_k], dim=1).to(acc).repeat_interleave(rep, dim=2)
    vals = torch.cat([ctx_v.expand(w, *ctx_v.shape), gathered_v], dim=1).to(acc).repeat_interleave(rep, dim=2)
    visible = torch.cat([slots.new_ones(w, ctx_k.shape[0], dtype=torch.bool), slots >= 0], dim=1)  # [W, C + A]
    scores = torch.einsum("whd,wshd->whs", q.to(acc), keys) * (dh**-0.5 if scale is None else scale)
    probs = scores.masked_fill(~visible[:, None], float("-inf")).softmax(-1)  # the context keeps every row finite
    return torch.einsum("whs,wshd->whd", probs, vals).to(q.dtype)


def check_score_shapes(query, table, pool_ids, pool_logits) -> None:
    """Shape errors that name the mismatch; single-sequence or batched (leading B) shapes."""
    if table.dim() != 2 or query.shape[-1] != table.shape[1]:
        raise ValueError(f"table must be [V, d_rank] matching query {tuple(query.shape)}, got {tuple(table.shape)}")
    if pool_ids.shape != pool_logits.shape or pool_ids.shape[:-1] != query.shape[:-1]:
        raise ValueError(
            f"pool_ids {tuple(pool_ids.shape)} and pool_logits {tuple(pool_logits.shape)} must both be [.., W, K] "
            f"with W from query {tuple(query.shape)}"
        )
    if pool_ids.dtype != torch.long:
        raise ValueError(f"pool_ids must be int64 token ids (-1 = padding), got {pool_ids.dtype}")


@batched(2, 2, 2, 2)
def weaver_step_scores_ref(
    query: torch.Tensor, table: torch.Tensor, pool_ids: torch.Tensor, pool_logits: torch.Tensor
) -> torch.Tensor:
    """Pool logits of W nodes: s(c) + table[c] . query for c in each node's pool, -inf at padding.

    Args:
        query: [W, R] each node's out_norm(h) (R = d_rank).
        table: [V, R] residual table W_lm @ W_lmq (shared; never batched).
        pool_ids: [W, K] int64 token ids of each node's next-depth pool, -1 = padding.
        pool_logits: [W, K] the drafter's raw logits s(c) of those pools.
    Returns:
        logits: [W, K] in pool_logits' dtype.
    """
    check_score_shapes(query, table, pool_ids, pool_logits)
    rows = table[pool_ids.clamp(min=0)].float()  # [W, K, R]: K rows per node, never [.., V]
    residual = (rows @ query.float()[:, :, None]).squeeze(-1)
    logits = pool_logits.float() + residual
    return logits.masked_fill(pool_ids < 0, float("-inf")).to(pool_logits.dtype)
