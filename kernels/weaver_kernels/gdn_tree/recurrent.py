"""Triton: the recurrent GDN tree kernels, per-branch verify (the paper's baseline) and commit (replay along the path).

Both keep a [K, BV] state slice per program and apply the delta rule token by token (METHOD.md section 7):
    S <- e^g S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def delta_step(b_s, b_k, b_v, b_g, b_beta):
    """One gated delta-rule update of a state slice b_s [BK, BV] by key b_k [BK] and value b_v [BV]."""
    b_s = b_s * tl.exp(b_g)
    b_u = b_beta * (b_v - tl.sum(b_s * b_k[:, None], axis=0))
    return b_s + b_k[:, None] * b_u[None, :]


@triton.jit
def gdn_tree_per_branch_kernel(
    q,
    k,
    v,
    g,
    beta,
    parents,
    h0,
    states,
    o,
    N,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_h0 = h0 + ((i_b * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :]
    for i_n in range(0, N):
        i_p = tl.load(parents + i_b * N + i_n)
        # a node starts from its parent's cached state, node 0 from the committed one
        p_sp = states + (((i_b * N + i_p) * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :]
        b_s = tl.load(tl.where(i_p < 0, p_h0, p_sp), mask=m_kv, other=0.0).to(tl.float32)
        b_k = tl.load(k + ((i_b * N + i_n) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_q = tl.load(q + ((i_b * N + i_n) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + ((i_b * N + i_n) * HV + i_hv) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_g = tl.load(g + (i_b * N + i_n) * HV + i_hv).to(tl.float32)
        b_beta = tl.load(beta + (i_b * N + i_n) * HV + i_hv).to(tl.float32)
        b_s = delta_step(b_s, b_k, b_v, b_g, b_beta)
        p_s = states + (((i_b * N + i_n) * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :]
        tl.store(p_s, b_s.to(states.dtype.element_ty), mask=m_kv)
        p_o = o + ((i_b * N + i_n) * HV + i_hv) * V + o_v
        tl.store(p_o, tl.sum(b_s * b_q[:, None], axis=0).to(o.dtype.element_ty), mask=m_v)
        # children read this state back from global memory
        tl.debug_barrier()


@triton.jit
def gdn_tree_commit_kernel(
    k,
    v,
    g,
    beta,
    parents,
    h0,
    leaf,
    ht,
    N,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    i_leaf = tl.load(leaf + i_b).to(tl.int32)
    # path length = depth(leaf) + 1; the path is short (depth cap), so each step re-walks from the leaf
    n_path = 0
    i_cur = i_leaf
    while i_cur >= 0:
        n_path += 1
        i_cur = tl.load(parents + i_b * N + i_cur).to(tl.int32)
    b_s = tl.load(h0 + ((i_b * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :], mask=m_kv, other=0.0)
    b_s = b_s.to(tl.float32)
    for i_step in range(0, n_path):
        i_n = i_leaf
        for _ in range(0, n_path - 1 - i_step):
            i_n = tl.load(parents + i_b * N + i_n).to(tl.int32)
        b_k = tl.load(k + ((i_b * N + i_n) * H + i_h) * K + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + ((i_b * N + i_n) * HV + i_hv) * V + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_g = tl.load(g + (i_b * N + i_n) * HV + i_hv).to(tl.float32)
        b_beta = tl.load(beta + (i_b * N + i_n) * HV + i_hv).to(tl.float32)
        b_s = delta_step(b_s, b_k, b_v, b_g, b_beta)
    p_ht = ht + ((i_b * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :]
    tl.store(p_ht, b_s.to(ht.dtype.element_ty), mask=m_kv)


def _blocks(K: int, V: int) -> tuple[int, int]:
    """The whole key dim per program (the state slice is [K, BV]); value dim split for parallelism."""
    return triton.next_power_of_2(K), min(32, triton.next_power_of_2(V))


def gdn_tree_verify_per_branch_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-branch recurrent baseline: a full state per node from its parent's.

    Args:
        q, k: [B, N, H, K]. v: [B, N, HV, V]. g, beta: [B, N, HV]. parents: [B, N] int64. initial_state: [B, HV, K, V].
    Returns:
        o: [B, N, HV, V] (v's dtype) and states: [B, N, HV, K, V] (initial_state's dtype).
    """
    B, N, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BK, BV = _blocks(K, V)
    states = torch.empty(B, N, HV, K, V, dtype=initial_state.dtype, device=k.device)
    o = torch.empty(B, N, HV, V, dtype=v.dtype, device=v.device)
    args = (x.contiguous() for x in (q, k, v, g, beta, parents, initial_state))
    grid = (triton.cdiv(V, BV), B * HV)
    gdn_tree_per_branch_kernel[grid](*args, states, o, N, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV)
    return o, states


def gdn_tree_commit_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
    leaf: torch.Tensor,
) -> torch.Tensor:
    """State after replaying the delta rule along root..leaf.

    Args:
        k: [B, N, H, K]. v: [B, N, HV, V]. g, beta: [B, N, HV]. parents: [B, N] int64. initial_state: [B, HV, K, V].
        leaf: [B] int64 accepted leaf per sequence (0 = only the root token was accepted).
    Returns:
        state: [B, HV, K, V] in initial_state's dtype.
    """
    B, N, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BK, BV = _blocks(K, V)
    ht = torch.empty(B, HV, K, V, dtype=initial_state.dtype, device=k.device)
    args = (x.contiguous() for x in (k, v, g, beta, parents, initial_state, leaf))
    gdn_tree_commit_kernel[(triton.cdiv(V, BV), B * HV)](*args, ht, N, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV)
    return ht
