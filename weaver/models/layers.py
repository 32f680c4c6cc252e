"""Small building blocks shared by every family: RMSNorm (plain and zero-centred), gated RMSNorm, RoPE, SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm in fp32; `zero_centred` stores w and scales by (1 + w) (Qwen3-Next / Qwen3.5 convention)."""

    def __init__(self, dim: int, eps: float, zero_centred: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centred = zero_centred
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centred else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., dim] -> [..., dim]: x / sqrt(mean(x^2) + eps) * w, written out (F.rms_norm is slower at decode)."""
        scale = 1.0 + self.weight.float() if self.zero_centred else self.weight.float()
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * scale).type_as(x)


class GatedRMSNorm(nn.Module):
    """GDN output norm: norm(o) * w * silu(z), per value head."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate [..., dim] -> [..., dim]."""
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * y.type_as(x) * F.silu(gate.float())).type_as(x)


class Rotary(nn.Module):
    """RoPE tables for explicit positions (rotate-half layout; the first `rotary_dim` dims of each head rotate)."""

    def __init__(self, rotary_dim: int, theta: float) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.theta = theta

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin), each [T, rotary_dim]. No buffers: the model can be built on meta.

        The rotate-half sign is folded into sin: cos = [cos f, cos f], sin = [-sin f, sin f] (see apply_rotary).
        """
        dims = torch.arange(0, self.rotary_dim, 2, dtype=torch.float, device=positions.device)
        inv_freq = 1.0 / (self.theta ** (dims / self.rotary_dim))
        freqs = positions.float()[:, None] * inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, head_dim], (cos, sin) [T, rotary_dim] of Rotary -> x with its first rotary_dim dims rotated.

    Rotate-half RoPE x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin (halves x1, x2 of the rotary dims), computed as
    x * cos + [x2, x1] * sin with Rotary's signed sin: one swap, one multiply, one fused multiply-add.
    """
    rot = cos.shape[-1]
    half = rot // 2
    swapped = torch.cat((x[..., half:rot], x[..., :half]), dim=-1)
    if rot == x.shape[-1]:
        return torch.addcmul(x * cos, swapped, sin)
    return torch.cat((torch.addcmul(x[..., :rot] * cos, swapped, sin), x[..., rot:]), dim=-1)


def fuse_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linears that read the same input -> one (weight [sum of out_features, in], bias [sum of out_features] or None).

    The fused weight is stored input-major (its transpose [in, out] is contiguous): on x86 CPUs MKL's batch-1 GEMV
    is ~15% faster against a wide [in, out] matrix (gate|up, the LM head) than against [out, in], and no slower for
    q|k|v. Each linear's parameters become views of their rows of the fused tensors: one copy in memory, in-place
    updates (load_state_dict, an optimizer step) reach both, and the state_dict keys and values are unchanged.
    A move (.to(device or dtype)) would copy parameters and fused tensors apart: Transformer._apply fuses again.
    """
    with torch.no_grad():
        weight = torch.cat([m.weight for m in linears]).t().contiguous().t()
        bias = torch.cat([m.bias for m in linears]) if linears[0].bias is not None else None
    row = 0
    for m in linears:
        rows = slice(row, row + m.out_features)
        m.weight = nn.Parameter(weight[rows], requires_grad=m.weight.requires_grad)
        if bias is not None:
            m.bias = nn.Parameter(bias[rows], requires_grad=m.bias.requires_grad)
        row += m.out_features
    return weight, bias


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    gate_up_weight: torch.Tensor | None
    gate_up_bias: torch.Tensor | None

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        # gate|up in one matrix once fuse_projections() ran (non-persistent: the state_dict keeps gate/up_proj)
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.register_buffer("gate_up_bias", None, persistent=False)

    def fuse_projections(self) -> None:
        """Inference: gate_proj and up_proj become row blocks of one weight (one GEMV per token instead of two).

        The modules keep their parameters as views of the fused rows (fuse_linears), and forward uses the fused
        weight only while autograd is off, so training still reaches gate_proj and up_proj.
        """
        self.gate_up_weight, self.gate_up_bias = fuse_linears(self.gate_proj, self.up_proj)

    def unfuse_projections(self) -> None:
        """Drop the fused weight (gate/up_proj keep their values; they stop being views once moved)."""
        self.gate_up_weight = self.gate_up_bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim] -> [B, T, dim]."""
        if self.gate_up_weight is not None and not torch.is_grad_enabled():
            gate, up = F.linear(x, self.gate_up_weight, self.gate_up_bias).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)
