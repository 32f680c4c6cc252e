"""Small building blocks shared by every family: RMSNorm (plain and zero-centred), gated RMSNorm, RoPE, SwiGLU MLP,
and the inference-only CPU weight layouts (fused projections, oneDNN pre-packed weights)."""

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


PACKED_ROWS = (2, 128)  # rows (tokens) for which a pre-packed weight beats MKL's GEMM on x86 CPUs, see PackedWeight


class PackedWeight:
    """A oneDNN pre-packed copy of a CPU fp32 weight [out, in] for inference GEMMs of a few rows.

    MKL packs the weight into its blocked layout inside every GEMM call, which dominates a GEMM of 2 to ~100 rows (a
    verify of N tree nodes, a drafter block, a batched decode); oneDNN's packed layout is made once. Measured
    on this project's 2-core x86 CPU (fp32, one thread, weights out of cache): SmolLM2's gate|up [3072, 576] at 16
    rows 1.48 -> 0.90 ms, its LM head [49152, 576] 23.2 -> 13.4 ms; at 1 row and at 256 rows the packed form is not
    faster, so `linear` uses it for PACKED_ROWS only. The copy is made at the first call that uses it (a job that
    only decodes one token at a time never pays for it) and follows the weight: it is rebuilt when the weight's
    storage or version counter changed (load_state_dict, an optimizer step). It costs one more copy in memory.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.key: tuple[int, int] | None = None
        self.opaque: torch.Tensor | None = None

    @staticmethod
    def supported(weight: torch.Tensor) -> bool:
        return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()

    @classmethod
    def of(cls, weight: torch.Tensor, pack: bool = True) -> PackedWeight | None:
        """A PackedWeight of `weight` when `pack` and the weight is supported (CPU fp32), else None."""
        return cls(weight) if pack and cls.supported(weight) else None

    def _pack(self) -> None:
        self.key = (self.weight.data_ptr(), self.weight._version)
        self.opaque = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] (CPU fp32) -> [..., out]."""
        if (self.weight.data_ptr(), self.weight._version) != self.key:
            self._pack()
        return torch.ops.mkldnn._linear_pointwise(x, self.opaque, bias, "none", [], "")


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight | None
) -> torch.Tensor:
    """F.linear(x [..., in], weight [out, in], bias) -> [..., out]; through `packed` for CPU fp32 inputs of
    PACKED_ROWS rows with autograd off (the packed copy has no gradient path)."""
    if packed is not None and not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype == torch.float32:
        rows = x.numel() // x.shape[-1]
        if PACKED_ROWS[0] <= rows <= PACKED_ROWS[1]:
            return packed(x, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear with an optional inference-time PackedWeight (`pack()`); same parameters and state_dict."""

    packed: PackedWeight | None = None

    def pack(self, enabled: bool = True) -> None:
        """Use a PackedWeight of this weight from now on (CPU fp32 only), or none with `enabled` False."""
        self.packed = PackedWeight.of(self.weight, enabled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


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
        self.down_proj = Linear(hidden, dim, bias=bias)
        self.gate_up_packed: PackedWeight | None = None
        # gate|up in one matrix once fuse_projections() ran (non-persistent: the state_dict keeps gate/up_proj)
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.register_buffer("gate_up_bias", None, persistent=False)

    def fuse_projections(self, pack: bool = False) -> None:
        """Inference: gate_proj and up_proj become row blocks of one weight (one GEMV per token instead of two).

        The modules keep their parameters as views of the fused rows (fuse_linears), and forward uses the fused
        weight only while autograd is off, so training still reaches gate_proj and up_proj. `pack`: also a
        PackedWeight of it.
        """
        self.gate_up_weight, self.gate_up_bias = fuse_linears(self.gate_proj, self.up_proj)
        self.gate_up_packed = PackedWeight.of(self.gate_up_weight, pack)

    def unfuse_projections(self) -> None:
        """Drop the fused weight (gate/up_proj keep their values; they stop being views once moved)."""
        self.gate_up_weight = self.gate_up_bias = self.gate_up_packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim] -> [B, T, dim]."""
        if self.gate_up_weight is not None and not torch.is_grad_enabled():
            gate, up = linear(x, self.gate_up_weight, self.gate_up_bias, self.gate_up_packed).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)
