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
        """x [..., dim] -> [..., dim]."""
        scale = 1.0 + self.weight.float() if self.zero_centred else self.weight.float()
        return F.rms_norm(x.float(), (x.shape[-1],), scale, self.eps).type_as(x)


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
        """positions [T] int64 -> (cos, sin), each [T, rotary_dim]. No buffers: the model can be built on meta."""
        dims = torch.arange(0, self.rotary_dim, 2, dtype=torch.float, device=positions.device)
        inv_freq = 1.0 / (self.theta ** (dims / self.rotary_dim))
        freqs = positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, head_dim], cos/sin [T, rotary_dim] -> x with its first rotary_dim dims rotated."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    x1, x2 = x_rot[..., : rot // 2], x_rot[..., rot // 2 :]
    rotated = x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.shape[-1] else rotated


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim] -> [B, T, dim]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
