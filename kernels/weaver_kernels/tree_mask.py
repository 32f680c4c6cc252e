"""Triton: ancestor-or-self mask and path prefix sums of a draft tree (the paper's K0 "scalars" kernel).

Every row walks its own parent chain, so the kernel needs only parents and costs O(N * depth); the mask is shared by the
GDN solve and tree attention of every layer of one verify step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def tree_scalars_kernel(
    parents,
    g,
    mask,
    G,
    N,
    HV: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
    BHV: tl.constexpr,
    USE_G: tl.constexpr,
):
    i_t, i_b = tl.program_id(0), tl.program_id(1)
    o_i = i_t * BT + tl.arange(0, BT)
    o_j = tl.arange(0, BN)
    o_h = tl.arange(0, BHV)
    m_i = o_i < N
    b_cur = tl.where(m_i, o_i, -1)
    b_m = tl.zeros([BT, BN], dtype=tl.int32)
    b_G = tl.zeros([BT, BHV], dtype=tl.float32)
    while tl.max(b_cur, axis=0) >= 0:
        m_cur = b_cur >= 0
        b_m = tl.where(o_j[None, :] == b_cur[:, None], 1, b_m)
        if USE_G:
            p_g = g + (i_b * N + b_cur[:, None]) * HV + o_h[None, :]
            b_G += tl.load(p_g, mask=m_cur[:, None] & (o_h[None, :] < HV), other=0.0).to(tl.float32)
        b_cur = tl.load(parents + i_b * N + b_cur, mask=m_cur, other=-1).to(tl.int32)
    p_m = mask + (i_b * N + o_i[:, None]) * N + o_j[None, :]
    tl.store(p_m, b_m.to(tl.int8), mask=m_i[:, None] & (o_j[None, :] < N))
    if USE_G:
        p_G = G + (i_b * N + o_i[:, None]) * HV + o_h[None, :]
        tl.store(p_G, b_G, mask=m_i[:, None] & (o_h[None, :] < HV))


def tree_scalars(parents: torch.Tensor, g: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Ancestor-or-self mask and path cumsum.

    Args:
        parents: [B, N] int64, parents[:, 0] = -1, parents[:, i] < i. g: [B, N, HV] log-decays, or None.
    Returns:
        mask: [B, N, N] int8, mask[b, i, j] = 1 iff j is an ancestor-or-self of i; G: [B, N, HV] fp32
        (G_i = g_i + G_parent(i)) or None.
    """
    b, n = parents.shape
    hv = 1 if g is None else g.shape[-1]
    mask = torch.empty(b, n, n, dtype=torch.int8, device=parents.device)
    G = None if g is None else torch.empty(b, n, hv, dtype=torch.float32, device=parents.device)
    BT = 32
    grid = (triton.cdiv(n, BT), b)
    tree_scalars_kernel[grid](
        parents.contiguous(),
        mask if g is None else g.contiguous(),
        mask,
        mask if G is None else G,
        n,
        HV=hv,
        BT=BT,
        BN=triton.next_power_of_2(n),
        BHV=triton.next_power_of_2(hv),
        USE_G=g is not None,
    )
    return mask, G
