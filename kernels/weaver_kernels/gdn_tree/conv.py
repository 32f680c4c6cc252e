"""Triton: tree-aware short causal depthwise conv (METHOD.md section 7, the conv window is a second piece of state).

Each node convolves over its own ancestor path; window entries above node 0 come from the committed conv state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def gdn_tree_conv1d_kernel(
    x,
    weight,
    bias,
    parents,
    conv_state,
    y,
    N,
    C,
    W: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_i = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_i, m_c = o_i < N, o_c < C
    b_cur = tl.where(m_i, o_i, -1)
    # index into the committed window once the walk has passed node 0 (oldest entry first)
    b_sidx = tl.zeros([BT], dtype=tl.int32) + (W - 1)
    b_y = tl.zeros([BT, BC], dtype=tl.float32)
    for i_w in range(0, W):
        m_in = b_cur >= 0
        b_sidx = tl.where(m_in, b_sidx, b_sidx - 1)
        p_x = x + (i_b * N + b_cur[:, None]) * C + o_c[None, :]
        b_x = tl.load(p_x, mask=(m_in & m_i)[:, None] & m_c[None, :], other=0.0).to(tl.float32)
        p_s = conv_state + (i_b * C + o_c[None, :]) * (W - 1) + b_sidx[:, None]
        b_x += tl.load(p_s, mask=((~m_in) & m_i)[:, None] & m_c[None, :], other=0.0).to(tl.float32)
        b_w = tl.load(weight + o_c * W + (W - 1 - i_w), mask=m_c, other=0.0).to(tl.float32)
        b_y += b_x * b_w[None, :]
        b_cur = tl.load(parents + i_b * N + b_cur, mask=m_in & m_i, other=-1).to(tl.int32)
    if HAS_BIAS:
        b_y += tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)[None, :]
    if SILU:
        b_y = b_y * tl.sigmoid(b_y)
    p_y = y + (i_b * N + o_i[:, None]) * C + o_c[None, :]
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_i[:, None] & m_c[None, :])


def gdn_tree_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    parents: torch.Tensor,
    conv_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Tree-aware causal depthwise conv.

    Args:
        x: [B, N, C]. weight: [C, W]. bias: [C] or None. parents: [B, N] int64. conv_state: [B, C, W-1] (oldest first).
        activation: "silu" or None.
    Returns:
        y: [B, N, C] in x's dtype.
    """
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    B, N, C = x.shape
    W = weight.shape[1]
    y = torch.empty_like(x)
    BT, BC = 32, min(64, triton.next_power_of_2(C))
    grid = (triton.cdiv(N, BT), triton.cdiv(C, BC), B)
    x, weight, parents, conv_state = (t.contiguous() for t in (x, weight, parents, conv_state))
    b = weight if bias is None else bias.contiguous()
    flags = dict(HAS_BIAS=bias is not None, SILU=activation == "silu")
    gdn_tree_conv1d_kernel[grid](x, weight, b, parents, conv_state, y, N, C, W=W, BT=BT, BC=BC, **flags)
    return y
