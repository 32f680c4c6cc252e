"""Full attention with explicit positions, an explicit mask and a static K/V cache (METHOD.md section 6).

Llama: plain GQA. Qwen3: + RMSNorm of q and k per head. Qwen3-Next / Qwen3.5: q_proj also emits a per-head output
gate (out * sigmoid(gate)), norms are zero-centred and RoPE is partial.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import weaver_kernels
from torch import nn

from weaver.models.cache import KVCache, Pass
from weaver.models.config import ModelConfig
from weaver.models.layers import Linear, PackedWeight, RMSNorm, apply_rotary, fuse_linears, linear


class Attention(nn.Module):
    qkv_weight: torch.Tensor | None
    qkv_bias: torch.Tensor | None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.gated = config.hybrid
        dim, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(dim, self.n_heads * self.head_dim * (2 if self.gated else 1), bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, dim, bias=bias)
        self.qkv_packed: PackedWeight | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centred=config.hybrid)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centred=config.hybrid)
        else:
            self.q_norm = self.k_norm = None
        # q|k|v in one matrix once fuse_projections() ran (non-persistent: the state_dict keeps q/k/v_proj)
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)

    def fuse_projections(self, pack: bool = False) -> None:
        """Inference: q_proj, k_proj and v_proj become row blocks of one weight, so a token takes one GEMV, not three.

        The three modules keep their parameters (views of the fused rows: same memory, same state_dict), and
        forward uses the fused weight only while autograd is off, so training still reaches q/k/v_proj. `pack`: also
        a PackedWeight of it (layers.PackedWeight).
        """
        self.qkv_weight, self.qkv_bias = fuse_linears(self.q_proj, self.k_proj, self.v_proj)
        self.qkv_packed = PackedWeight.of(self.qkv_weight, pack)

    def unfuse_projections(self) -> None:
        """Drop the fused weight (q/k/v_proj keep their values; they stop being views once moved)."""
        self.qkv_weight = self.qkv_bias = self.qkv_packed = None

    def new_cache(self, batch_size: int, slots: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        shape = (batch_size, self.n_kv_heads, slots, self.head_dim)
        return KVCache(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | None, p: Pass
    ) -> torch.Tensor:
        """x [B, T, d], rope (cos, sin) [T, rotary_dim] -> [B, T, d].

        With a cache, the T new K/V go to slots [p.start, p.start + T) and queries see slots [0, p.start + T) under
        p.mask; without one, plain causal attention over the T tokens.
        """
        b, t, _ = x.shape
        h, h_kv = self.n_heads, self.n_kv_heads
        if self.qkv_weight is not None and not torch.is_grad_enabled():
            kv_width = h_kv * self.head_dim
            qkv = linear(x, self.qkv_weight, self.qkv_bias, self.qkv_packed)
            q, k, v = qkv.split([qkv.shape[-1] - 2 * kv_width, kv_width, kv_width], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, h, -1)
        if self.gated:
            q, gate = q.chunk(2, dim=-1)
        k = k.view(b, t, h_kv, self.head_dim)
        v = v.view(b, t, h_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # q and k heads side by side: RoPE in one call
        q, k = apply_rotary(torch.cat((q, k), dim=2).transpose(1, 2), *rope).split((h, h_kv), dim=1)
        gqa = h != h_kv
        if cache is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=gqa)
        else:
            end = p.start + t
            cache.k[:, :, p.start : end] = k
            cache.v[:, :, p.start : end] = v
            if p.parents is not None and weaver_kernels.resolve("tree_attention", q.device) != "ref":
                # a tree verify on a fast backend (Triton on CUDA tensors): the kernel walks the ancestors itself
                # instead of reading a dense [N, start + N] mask; it takes [B, N, H, D] and reads the cache in place
                prefix_k, prefix_v = (c[:, :, : p.start].transpose(1, 2) for c in (cache.k, cache.v))
                out = weaver_kernels.tree_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), prefix_k, prefix_v, p.parents
                ).transpose(1, 2)
            else:
                out = F.scaled_dot_product_attention(
                    q, cache.k[:, :, :end], cache.v[:, :, :end], attn_mask=p.mask, enable_gqa=gqa
                )
        out = out.transpose(1, 2).reshape(b, t, -1)
        if self.gated:
            out = out * torch.sigmoid(gate.reshape(b, t, -1))
        return self.o_proj(out)

    def commit(self, cache: KVCache, start: int, path: torch.Tensor) -> None:
        """Compact the accepted nodes' K/V (scratch slots start + path) into slots [start, start + len(path))."""
        src = start + path
        end = start + path.numel()
        cache.k[:, :, start:end] = cache.k.index_select(2, src)
        cache.v[:, :, start:end] = cache.v.index_select(2, src)
