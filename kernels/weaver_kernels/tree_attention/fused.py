"""Triton: tree attention in verify (METHOD.md section 6), flash-attention style with an online softmax.

A program owns BT tree queries of one head; it streams the committed prefix in BS-wide key blocks, then the tree
blocks j <= i with the ancestor-or-self mask. Every query sees itself, so no row is all -inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weaver_kernels.tree_mask import tree_scalars


@triton.jit
def softmax_block(b_q, b_k, b_v, m_s, b_m, b_l, b_acc, scale, PRECISION: tl.constexpr):
    """Online-softmax update with one key block: b_k [BD, BS] (transposed), b_v [BS, BD], visibility m_s [BT, BS]."""
    b_s = tl.dot(b_q, b_k, input_precision=PRECISION) * scale
    b_s = tl.where(m_s, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
    # rows that have seen no key yet (padding) subtract 0, not -inf, so no NaN appears
    b_m_safe = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_r = tl.exp(b_m - b_m_safe)
    b_p = tl.exp(b_s - b_m_safe[:, None])
    b_l = b_l * b_r + tl.sum(b_p, axis=1)
    b_acc = b_acc * b_r[:, None] + tl.dot(b_p, b_v, input_precision=PRECISION)
    return b_m_new, b_l, b_acc


@triton.jit
def tree_attention_kernel(
    q,
    k,
    v,
    kp,
    vp,
    mask,
    o,
    scale,
    N,
    T,
    s_kp_b,
    s_kp_t,
    s_kp_h,
    s_vp_b,
    s_vp_t,
    s_vp_h,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    BT: tl.constexpr,
    BS: tl.constexpr,
    BD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hq = i_bh // HQ, i_bh % HQ
    i_h = i_hq // (HQ // HKV)
    o_i = i_t * BT + tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    m_i, m_d = o_i < N, o_d < D
    p_q = q + ((i_b * N + o_i[:, None]) * HQ + i_hq) * D + o_d[None, :]
    b_q = tl.load(p_q, mask=m_i[:, None] & m_d[None, :], other=0.0).to(tl.float32)
    b_m = tl.full([BT], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BT], dtype=tl.float32)
    b_acc = tl.zeros([BT, BD], dtype=tl.float32)
    for i_s in range(0, tl.cdiv(T, BS)):
        o_s = i_s * BS + tl.arange(0, BS)
        m_s = o_s < T
        p_k = kp + i_b * s_kp_b + o_s[None, :] * s_kp_t + i_h * s_kp_h + o_d[:, None]
        p_v = vp + i_b * s_vp_b + o_s[:, None] * s_vp_t + i_h * s_vp_h + o_d[None, :]
        b_k = tl.load(p_k, mask=m_d[:, None] & m_s[None, :], other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_s[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        m_vis = m_i[:, None] & m_s[None, :]
        b_m, b_l, b_acc = softmax_block(b_q, b_k, b_v, m_vis, b_m, b_l, b_acc, scale, PRECISION)
    for j_t in range(0, i_t + 1):
        o_j = j_t * BT + tl.arange(0, BT)
        m_j = o_j < N
        p_k = k + ((i_b * N + o_j[None, :]) * HKV + i_h) * D + o_d[:, None]
        p_v = v + ((i_b * N + o_j[:, None]) * HKV + i_h) * D + o_d[None, :]
        b_k = tl.load(p_k, mask=m_d[:, None] & m_j[None, :], other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_j[:, None] & m_d[None, :], other=0.0).to(tl.float32)
        p_m = mask + (i_b * N + o_i[:, None]) * N + o_j[None, :]
        m_vis = tl.load(p_m, mask=m_i[:, None] & m_j[None, :], other=0) != 0
        b_m, b_l, b_acc = softmax_block(b_q, b_k, b_v, m_vis, b_m, b_l, b_acc, scale, PRECISION)
    # padded rows (beyond N) saw no key: keep them finite, they are not stored
    b_o = b_acc / tl.where(m_i, b_l, 1.0)[:, None]
    p_o = o + ((i_b * N + o_i[:, None]) * HQ + i_hq) * D + o_d[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_i[:, None] & m_d[None, :])


def tree_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_prefix: torch.Tensor,
    v_prefix: torch.Tensor,
    parents: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of tree tokens over the committed prefix plus their ancestors-or-self.

    Args:
        q: [B, N, HQ, D]. k, v: [B, N, HKV, D]. k_prefix, v_prefix: [B, T, HKV, D], any strides with a unit last
        stride (cache views need no copy). parents: [B, N] int64. scale: default D^-1/2.
    Returns:
        o: [B, N, HQ, D] in q's dtype.
    """
    B, N, HQ, D = q.shape
    HKV, T = k.shape[2], k_prefix.shape[1]
    if k_prefix.stride(-1) != 1 or v_prefix.stride(-1) != 1:
        raise ValueError("k_prefix / v_prefix need a contiguous last (head) dim; pass .contiguous() views")
    mask, _ = tree_scalars(parents)
    q, k, v = (x.contiguous() for x in (q, k, v))
    o = torch.empty_like(q)
    BT, BD = 32, max(16, triton.next_power_of_2(D))
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    tree_attention_kernel[(triton.cdiv(N, BT), B * HQ)](
        q,
        k,
        v,
        k_prefix,
        v_prefix,
        mask,
        o,
        D**-0.5 if scale is None else scale,
        N,
        T,
        *k_prefix.stride()[:3],
        *v_prefix.stride()[:3],
        HQ=HQ,
        HKV=HKV,
        D=D,
        BT=BT,
        BS=32,
        BD=BD,
        PRECISION=prec,
    )
    return o
