"""Triton: rollback-free GDN tree verify by the fused masked solve (METHOD.md section 7).

Structure of the paper's kernels, 32-wide tiles over topologically ordered nodes (ancestors have smaller indices, so
every ancestor-masked matrix is lower triangular):
    K0 tree_scalars: ancestor-or-self mask and path prefix G = P @ g           (weaver_kernels.tree_mask)
    K1 gram:   A_ij = beta_i e^(G_i - G_j) k_i.k_j (proper ancestors), QK_ij = e^(G_i - G_j) q_i.k_j (ancestor-or-self),
               lower tiles only; each diagonal tile of (I + A) is inverted in place by the nilpotent Neumann series
               (I + M)^-1 = prod_s (I + (-M)^(2^s)), s < log2(BT), by repeated squaring.
    K2+K3 solve: block forward substitution U_i = (I + A_ii)^-1 (beta_i (v_i - e^G_i k_i S0) - sum_(j<i) A_ij U_j), then
               o_i = e^G_i q_i S0 + sum_(j<=i) QK_ij U_j as soon as U_i is known. No recurrent state is written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from weaver_kernels.tree_mask import tree_scalars


@triton.jit
def gdn_tree_gram_kernel(
    q,
    k,
    beta,
    G,
    mask,
    Aw,
    Qw,
    N,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    LOG2_BT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_i, i_j, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if i_j > i_i:
        return
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_i = i_i * BT + tl.arange(0, BT)
    o_j = i_j * BT + tl.arange(0, BT)
    m_i, m_j = o_i < N, o_j < N
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        p_ki = k + ((i_b * N + o_i[:, None]) * H + i_h) * K + o_k[None, :]
        p_qi = q + ((i_b * N + o_i[:, None]) * H + i_h) * K + o_k[None, :]
        p_kj = k + ((i_b * N + o_j[None, :]) * H + i_h) * K + o_k[:, None]
        b_ki = tl.load(p_ki, mask=m_i[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_qi = tl.load(p_qi, mask=m_i[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_kj = tl.load(p_kj, mask=m_k[:, None] & m_j[None, :], other=0.0).to(tl.float32)
        b_kk += tl.dot(b_ki, b_kj, input_precision=PRECISION)
        b_qk += tl.dot(b_qi, b_kj, input_precision=PRECISION)
    b_Gi = tl.load(G + (i_b * N + o_i) * HV + i_hv, mask=m_i, other=0.0)
    b_Gj = tl.load(G + (i_b * N + o_j) * HV + i_hv, mask=m_j, other=0.0)
    b_beta = tl.load(beta + (i_b * N + o_i) * HV + i_hv, mask=m_i, other=0.0).to(tl.float32)
    p_m = mask + (i_b * N + o_i[:, None]) * N + o_j[None, :]
    m_anc_self = tl.load(p_m, mask=m_i[:, None] & m_j[None, :], other=0) != 0
    m_anc = m_anc_self & (o_i[:, None] != o_j[None, :])
    # ratios e^(G_i - G_j) <= 1 on ancestor pairs; -inf before exp so cross-branch pairs cannot overflow
    b_diff = b_Gi[:, None] - b_Gj[None, :]
    b_A = b_beta[:, None] * tl.exp(tl.where(m_anc, b_diff, float("-inf"))) * b_kk
    b_Q = tl.exp(tl.where(m_anc_self, b_diff, float("-inf"))) * b_qk
    if i_i == i_j:
        # (I + A)^-1 = (I + M)(I + M^2)(I + M^4)... with M = -A strictly lower, so M^BT = 0
        b_P = -b_A
        b_A = tl.where(o_i[:, None] == o_j[None, :], 1.0, 0.0) + b_P
        for _ in range(1, LOG2_BT):
            b_P = tl.dot(b_P, b_P, input_precision=PRECISION)
            b_A += tl.dot(b_A, b_P, input_precision=PRECISION)
    p_out = (i_b * HV + i_hv) * N * N + o_i[:, None] * N + o_j[None, :]
    tl.store(Aw + p_out, b_A, mask=m_i[:, None] & m_j[None, :])
    tl.store(Qw + p_out, b_Q, mask=m_i[:, None] & m_j[None, :])


@triton.jit
def gdn_tree_solve_kernel(
    q,
    k,
    v,
    beta,
    G,
    h0,
    Aw,
    Qw,
    Uw,
    o,
    N,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_A = Aw + (i_b * HV + i_hv) * N * N
    p_Q = Qw + (i_b * HV + i_hv) * N * N
    p_U = Uw + (i_b * HV + i_hv) * N * V
    for i_t in range(0, tl.cdiv(N, BT)):
        o_i = i_t * BT + tl.arange(0, BT)
        m_i = o_i < N
        b_ks = tl.zeros([BT, BV], dtype=tl.float32)
        b_qs = tl.zeros([BT, BV], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            p_x = ((i_b * N + o_i[:, None]) * H + i_h) * K + o_k[None, :]
            b_k = tl.load(k + p_x, mask=m_i[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            b_q = tl.load(q + p_x, mask=m_i[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            p_h = h0 + ((i_b * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :]
            b_h = tl.load(p_h, mask=m_k[:, None] & m_v[None, :], other=0.0).to(tl.float32)
            b_ks += tl.dot(b_k, b_h, input_precision=PRECISION)
            b_qs += tl.dot(b_q, b_h, input_precision=PRECISION)
        b_eG = tl.exp(tl.load(G + (i_b * N + o_i) * HV + i_hv, mask=m_i, other=0.0))
        b_beta = tl.load(beta + (i_b * N + o_i) * HV + i_hv, mask=m_i, other=0.0).to(tl.float32)
        p_vi = v + ((i_b * N + o_i[:, None]) * HV + i_hv) * V + o_v[None, :]
        b_vi = tl.load(p_vi, mask=m_i[:, None] & m_v[None, :], other=0.0).to(tl.float32)
        b_rhs = b_beta[:, None] * (b_vi - b_eG[:, None] * b_ks)
        b_o = b_eG[:, None] * b_qs
        for j_t in range(0, i_t):
            o_j = j_t * BT + tl.arange(0, BT)
            m_ij = m_i[:, None] & (o_j[None, :] < N)
            b_Aij = tl.load(p_A + o_i[:, None] * N + o_j[None, :], mask=m_ij, other=0.0)
            b_Qij = tl.load(p_Q + o_i[:, None] * N + o_j[None, :], mask=m_ij, other=0.0)
            b_Uj = tl.load(p_U + o_j[:, None] * V + o_v[None, :], mask=(o_j[:, None] < N) & m_v[None, :], other=0.0)
            b_rhs -= tl.dot(b_Aij, b_Uj, input_precision=PRECISION)
            b_o += tl.dot(b_Qij, b_Uj, input_precision=PRECISION)
        m_ii = m_i[:, None] & m_i[None, :]
        b_inv = tl.load(p_A + o_i[:, None] * N + o_i[None, :], mask=m_ii, other=0.0)
        b_Qii = tl.load(p_Q + o_i[:, None] * N + o_i[None, :], mask=m_ii, other=0.0)
        b_u = tl.dot(b_inv, b_rhs, input_precision=PRECISION)
        b_o += tl.dot(b_Qii, b_u, input_precision=PRECISION)
        tl.store(p_U + o_i[:, None] * V + o_v[None, :], b_u, mask=m_i[:, None] & m_v[None, :])
        p_o = o + ((i_b * N + o_i[:, None]) * HV + i_hv) * V + o_v[None, :]
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_i[:, None] & m_v[None, :])
        # later tiles of this program read U_i back from global memory
        tl.debug_barrier()


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs keep full-precision dots (tests compare to 1e-4); half inputs may use tf32 tensor cores."""
    return "ieee" if dtype == torch.float32 else "tf32"


def gdn_tree_verify_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
) -> torch.Tensor:
    """Fused masked-solve GDN tree verify.

    Args:
        q, k: [B, N, H, K] (q scaled, both L2-normalised). v: [B, N, HV, V]. g, beta: [B, N, HV].
        parents: [B, N] int64. initial_state: [B, HV, K, V].
    Returns:
        o: [B, N, HV, V] in v's dtype.
    """
    B, N, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    q, k, v, beta, h0 = (x.contiguous() for x in (q, k, v, beta, initial_state))
    mask, G = tree_scalars(parents, g)
    # tl.dot needs an inner dim >= 16 on GPUs: key dims below 16 are padded (masked loads)
    BT, BK, BV = 32, max(16, min(64, triton.next_power_of_2(K))), min(64, triton.next_power_of_2(V))
    Aw = torch.empty(B, HV, N, N, dtype=torch.float32, device=k.device)
    Qw = torch.empty_like(Aw)
    Uw = torch.empty(B, HV, N, V, dtype=torch.float32, device=k.device)
    o = torch.empty(B, N, HV, V, dtype=v.dtype, device=v.device)
    NT, prec = triton.cdiv(N, BT), dot_precision(k.dtype)
    gdn_tree_gram_kernel[(NT, NT, B * HV)](
        q, k, beta, G, mask, Aw, Qw, N, H=H, HV=HV, K=K, BT=BT, BK=BK, LOG2_BT=5, PRECISION=prec
    )
    gdn_tree_solve_kernel[(triton.cdiv(V, BV), B * HV)](
        q, k, v, beta, G, h0, Aw, Qw, Uw, o, N, H=H, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV, PRECISION=prec
    )
    return o
