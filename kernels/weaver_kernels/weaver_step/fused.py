"""Triton: the Weaver adapter's node-expansion step (METHOD.md section 3).

Attention: one program per (node, query head) holds its query row and runs an online softmax first over the
context in BS-wide blocks, then over its own node slots (ancestors and self) gathered by index in BA-wide blocks;
a node sees at most depth cap + 1 slots, so the gather is a handful of rows. Scores: one program per (node,
BK-wide block of its pool) gathers BK table rows and reduces them against the query in BR-wide chunks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weaver_kernels.weaver_step.naive import check_attention_shapes, check_score_shapes


@triton.jit
def softmax_rows(b_q, b_k, b_v, m_s, b_m, b_l, b_acc, scale):
    """Online-softmax update of one query row with a key block b_k, b_v [BS, BD] of which m_s [BS] are visible."""
    b_s = tl.sum(b_k * b_q[None, :], axis=1) * scale
    b_s = tl.where(m_s, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=0))
    # nothing seen yet and a fully masked block: subtract 0, not -inf, so no NaN appears
    b_m_safe = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_r = tl.exp(b_m - b_m_safe)
    b_p = tl.exp(b_s - b_m_safe)
    b_l = b_l * b_r + tl.sum(b_p, axis=0)
    b_acc = b_acc * b_r + tl.sum(b_p[:, None] * b_v, axis=0)
    return b_m_new, b_l, b_acc


@triton.jit
def weaver_step_attention_kernel(
    q,
    ctx_k,
    ctx_v,
    node_k,
    node_v,
    slots,
    o,
    scale,
    W,
    C,
    M,
    A,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    BA: tl.constexpr,
    BD: tl.constexpr,
):
    i_w, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hq = i_bh // HQ, i_bh % HQ
    i_h = i_hq // (HQ // HKV)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    b_q = tl.load(q + ((i_b * W + i_w) * HQ + i_hq) * D + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_m = tl.full([], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([], dtype=tl.float32)
    b_acc = tl.zeros([BD], dtype=tl.float32)
    for i_s in range(0, tl.cdiv(C, BS)):
        o_s = i_s * BS + tl.arange(0, BS)
        m_s = o_s < C
        p_kv = ((i_b * C + o_s[:, None]) * HKV + i_h) * D + o_d[None, :]
        b_k = tl.load(ctx_k + p_kv, mask=m_s[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_v = tl.load(ctx_v + p_kv, mask=m_s[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_m, b_l, b_acc = softmax_rows(b_q, b_k, b_v, m_s, b_m, b_l, b_acc, scale)
    for i_a in range(0, tl.cdiv(A, BA)):
        o_a = i_a * BA + tl.arange(0, BA)
        b_slot = tl.load(slots + (i_b * W + i_w) * A + o_a, mask=o_a < A, other=-1)
        m_a = b_slot >= 0
        p_kv = ((i_b * M + b_slot[:, None]) * HKV + i_h) * D + o_d[None, :]
        b_k = tl.load(node_k + p_kv, mask=m_a[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_v = tl.load(node_v + p_kv, mask=m_a[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        b_m, b_l, b_acc = softmax_rows(b_q, b_k, b_v, m_a, b_m, b_l, b_acc, scale)
    p_o = o + ((i_b * W + i_w) * HQ + i_hq) * D + o_d
    tl.store(p_o, (b_acc / b_l).to(o.dtype.element_ty), mask=m_d)


def weaver_step_attention_triton(
    q: torch.Tensor,
    ctx_k: torch.Tensor,
    ctx_v: torch.Tensor,
    node_k: torch.Tensor,
    node_v: torch.Tensor,
    slots: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of W new nodes over the context plus their own node slots (ancestors and self).

    Args:
        q: [B, W, HQ, Dh]. ctx_k, ctx_v: [B, C, HKV, Dh], C >= 1. node_k, node_v: [B, M, HKV, Dh] node cache with
        the new nodes written. slots: [B, W, A] int64 node slots (-1 = padding), each in [0, M) (not checked here:
        that would synchronise the device). scale: default Dh^-1/2.
    Returns:
        o: [B, W, HQ, Dh] in q's dtype.
    """
    check_attention_shapes(q, ctx_k, ctx_v, node_k, node_v, slots)
    B, W, HQ, D = q.shape
    C, HKV, M, A = ctx_k.shape[1], ctx_k.shape[2], node_k.shape[1], slots.shape[2]
    q, ctx_k, ctx_v, node_k, node_v, slots = (x.contiguous() for x in (q, ctx_k, ctx_v, node_k, node_v, slots))
    o = torch.empty_like(q)
    weaver_step_attention_kernel[(W, B * HQ)](
        q,
        ctx_k,
        ctx_v,
        node_k,
        node_v,
        slots,
        o,
        D**-0.5 if scale is None else scale,
        W,
        C,
        M,
        A,
        HQ=HQ,
        HKV=HKV,
        D=D,
        BS=16,
        BA=16,
        BD=max(16, triton.next_power_of_2(D)),
    )
    return o


@triton.jit
def weaver_step_scores_kernel(
    query,
    table,
    pool_ids,
    pool_logits,
    out,
    K,
    R,
    BK: tl.constexpr,
    BR: tl.constexpr,
):
    i_k, i_bw = tl.program_id(0), tl.program_id(1)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_ids = tl.load(pool_ids + i_bw * K + o_k, mask=m_k, other=-1)
    m_c = b_ids >= 0
    b_res = tl.zeros([BK], dtype=tl.float32)
    for i_r in range(0, tl.cdiv(R, BR)):
        o_r = i_r * BR + tl.arange(0, BR)
        m_r = o_r < R
        b_q = tl.load(query + i_bw * R + o_r, mask=m_r, other=0.0).to(tl.float32)
        p_t = table + b_ids[:, None].to(tl.int64) * R + o_r[None, :]
        b_t = tl.load(p_t, mask=m_c[:, None] & m_r[None, :], other=0.0).to(tl.float32)
        b_res += tl.sum(b_t * b_q[None, :], axis=1)
    b_s = tl.load(pool_logits + i_bw * K + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_out = tl.where(m_c, b_s + b_res, float("-inf"))
    tl.store(out + i_bw * K + o_k, b_out.to(out.dtype.element_ty), mask=m_k)


def weaver_step_scores_triton(
    query: torch.Tensor, table: torch.Tensor, pool_ids: torch.Tensor, pool_logits: torch.Tensor
) -> torch.Tensor:
    """Pool logits s(c) + table[c] . query over each node's pool, -inf at padding.

    Args:
        query: [B, W, R]. table: [V, R] (shared by the batch). pool_ids: [B, W, K] int64, -1 = padding, else in
        [0, V) (not checked here). pool_logits: [B, W, K].
    Returns:
        logits: [B, W, K] in pool_logits' dtype.
    """
    check_score_shapes(query, table, pool_ids, pool_logits)
    R = query.shape[-1]
    K = pool_ids.shape[-1]
    query, table, pool_ids, pool_logits = (x.contiguous() for x in (query, table, pool_ids, pool_logits))
    out = torch.empty_like(pool_logits)
    weaver_step_scores_kernel[(triton.cdiv(K, 64), query.shape[0] * query.shape[1])](
        query, table, pool_ids, pool_logits, out, K, R, BK=64, BR=min(128, max(16, triton.next_power_of_2(R)))
    )
    return out
