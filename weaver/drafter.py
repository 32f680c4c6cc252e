"""DFlash-style factorized block drafter (METHOD.md section 2).

A small Qwen3-style stack with no embedding and no LM head of its own: it reuses the target's `embed_tokens` and
`lm_head`. Hidden states of several target layers are concatenated, projected (`fc`, no bias) and RMS-normed
(`hidden_norm`) into context features; every draft layer projects them with its own k/v projections and prepends them
to the block's K/V. The block is `[root, MASK x (B-1)]` at positions continuing the sequence, attention inside it is
non-causal, and one pass gives the marginals p(x_{L+d} | x_<L) for d = 1..B-1.

Context K/V depend only on each context token's features and position (no layer mixes context tokens), so a
per-sequence `DrafterCache` of projected K/V grows exactly by the newly committed tokens.

Module and parameter names follow z-lab's `DFlashDraftModel` (fc, hidden_norm, layers.*.self_attn.{q,k,v,o}_proj,
q_norm, k_norm, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm, norm), so a z-lab checkpoint
(config.json + model.safetensors) loads with strict=True; see `load_drafter` and `save_drafter`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from weaver.models.layers import MLP, RMSNorm


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash's default taps: evenly spaced over target layers 1..n-3 (the middle layer for a 1-layer drafter)."""
    if num_target_layers < 4 or num_draft_layers < 1:
        raise ValueError(f"need >= 4 target layers and >= 1 draft layer, got {num_target_layers}, {num_draft_layers}")
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DrafterConfig:
    """Architecture of a block drafter and the target it serves.

    `target_layer_ids` are 0-based target decoder layers whose outputs form the context features;
    `num_target_layers` is needed to request the target's last layer (Weaver's `target_hidden`).
    """

    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (root + at least one MASK), got {self.block_size}")
        if not self.target_layer_ids or not all(0 <= i < self.num_target_layers for i in self.target_layer_ids):
            raise ValueError(
                f"target_layer_ids {self.target_layer_ids} must be non-empty and within [0, {self.num_target_layers})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """Target layers to request: the context taps, then the last layer unless it already is a tap."""
        last = self.num_target_layers - 1
        return self.target_layer_ids if last in self.target_layer_ids else (*self.target_layer_ids, last)

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json in z-lab's DFlash format (a Qwen3Config with `dflash_config`)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "block_size": self.block_size,
            "dflash_config": {
                "block_size": self.block_size,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
            "num_target_layers": self.num_target_layers,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "layer_types": ["full_attention"] * self.num_layers,
            "use_sliding_window": False,
            "tie_word_embeddings": False,
            "dtype": "float32",
        }

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> DrafterConfig:
        """Parse z-lab's config.json; DFlash keys are read from `dflash_config` first, then the top level."""
        _reject_unsupported(raw)
        dflash = raw.get("dflash_config") or {}

        def pick(name: str, default: Any = None) -> Any:
            return dflash.get(name, raw.get(name, default))

        num_layers = raw["num_hidden_layers"]
        if "num_target_layers" not in raw:
            raise ValueError("config.json lacks 'num_target_layers' (the target's decoder layer count): add it")
        if pick("mask_token_id") is None:
            raise ValueError("config.json lacks 'mask_token_id' (top level or dflash_config): add it")
        layer_ids = pick("target_layer_ids") or build_target_layer_ids(raw["num_target_layers"], num_layers)
        rope = raw.get("rope_parameters") or {}
        return cls(
            block_size=int(pick("block_size", 16)),
            target_layer_ids=tuple(layer_ids),
            mask_token_id=int(pick("mask_token_id")),
            num_target_layers=int(raw["num_target_layers"]),
            hidden_size=raw["hidden_size"],
            num_layers=num_layers,
            num_heads=raw["num_attention_heads"],
            num_kv_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
            intermediate_size=raw["intermediate_size"],
            vocab_size=raw["vocab_size"],
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
        )


def _reject_unsupported(raw: dict[str, Any]) -> None:
    """Fail clearly on DFlash variants whose math this module does not implement."""
    dflash = raw.get("dflash_config") or {}
    arch = (raw.get("architectures") or ["DFlashDraftModel"])[0]
    problems = []
    if arch != "DFlashDraftModel":
        problems.append(f"architecture {arch!r} (only 'DFlashDraftModel' is supported)")
    if any(t != "full_attention" for t in raw.get("layer_types") or []) or raw.get("is_causal"):
        problems.append("sliding-window or causal draft attention (only full non-causal attention is supported)")
    if raw.get("attention_bias"):
        problems.append("attention_bias=true")
    for key, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", 0)):
        if float(dflash.get(key, raw.get(key)) or neutral) != neutral:
            problems.append(f"{key}={dflash.get(key, raw.get(key))}")
    if problems:
        raise ValueError("unsupported DFlash checkpoint: " + "; ".join(problems))


@dataclass(frozen=True)
class DraftBlock:
    """One drafter pass from a root (DESIGN.md, "Drafter output").

    Attributes:
        logits: [D, V] raw drafter logits of the marginals p(x_{L+d} | x_<L), d = 1..D (D = block_size - 1).
        hidden: [D, d_model] drafter final hidden per depth, after the drafter's final norm (what lm_head sees).
        target_hidden: [d_model] target's last-layer output at the last committed position.
    """

    logits: torch.Tensor
    hidden: torch.Tensor
    target_hidden: torch.Tensor


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., head_dim] for positions [...] (half-split rotation, as in HF Qwen3)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [b, h, n, hd] by cos/sin [b, n, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class DraftAttention(nn.Module):
    """Attention whose K/V are [context K/V ; block K/V]; q/k are RMS-normed per head before RoPE."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [b, kv_heads, n, head_dim] of inputs x [b, n, d] (RoPE applied to K)."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, -1, self.cfg.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, -1, self.cfg.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        context: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """x [b, Q, d] block inputs; context K/V [b, kv_heads, n, hd]; mask [b, Q, n + Q] bool (True = attend)."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, -1, self.cfg.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.kv(x, cos, sin)
        k = torch.cat([context[0], k_blk], dim=2)
        v = torch.cat([context[1], v_blk], dim=2)
        attn_mask = None if mask is None else mask[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, context, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class DrafterCache:
    """Per-sequence drafter state: projected context K/V of every committed token that the target has seen.

    keys/values: per draft layer [1, kv_heads, seq_len, head_dim]; target_hidden: [d_model] target's last-layer
    output at the last committed position (None before `extend`).
    """

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    target_hidden: torch.Tensor | None = None

    @property
    def seq_len(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0


class Drafter(nn.Module):
    """The block drafter. Inference: `new_cache` / `extend` / `draft`; training: `context_kv` + `forward`."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList([DraftLayer(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """Target layers the drafter consumes, in the order `extend` expects them."""
        return self.cfg.hidden_layers

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context K/V [b, kv_heads, n, head_dim] from tap features [b, n, L_taps, d] at positions [b, n]."""
        feats = self.hidden_norm(self.fc(features.flatten(-2)))
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        return [layer.self_attn.kv(feats, cos, sin) for layer in self.layers]

    def forward(
        self,
        block_embeds: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden [b, Q, d] of block inputs [b, Q, d] at positions [b, Q].

        mask [b, Q, n_ctx + Q] bool selects visible keys (None: every query sees all context and the whole block).
        """
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = block_embeds
        for layer, ctx in zip(self.layers, context, strict=True):
            x = layer(x, cos, sin, ctx, mask)
        return self.norm(x)

    def new_cache(self) -> DrafterCache:
        return DrafterCache()

    @torch.no_grad()
    def extend(self, cache: DrafterCache, hidden: torch.Tensor) -> None:
        """Append newly committed tokens: hidden [n, len(hidden_layers), d] in the order of `hidden_layers`."""
        if hidden.dim() != 3 or hidden.shape[1] != len(self.hidden_layers):
            raise ValueError(
                f"hidden must be [n, {len(self.hidden_layers)}, d] for target layers {self.hidden_layers}, "
                f"got {tuple(hidden.shape)}"
            )
        n_taps = len(self.cfg.target_layer_ids)
        last = self.hidden_layers.index(self.cfg.num_target_layers - 1)
        start = cache.seq_len
        positions = torch.arange(start, start + hidden.shape[0], device=hidden.device)[None]
        new = self.context_kv(hidden[None, :, :n_taps].to(self.fc.weight.dtype), positions)
        if cache.keys:
            cache.keys = [torch.cat([k, nk], dim=2) for k, (nk, _) in zip(cache.keys, new, strict=True)]
            cache.values = [torch.cat([v, nv], dim=2) for v, (_, nv) in zip(cache.values, new, strict=True)]
        else:
            cache.keys, cache.values = [k for k, _ in new], [v for _, v in new]
        cache.target_hidden = hidden[-1, last]

    @torch.no_grad()
    def draft(self, cache: DrafterCache, root: int, embed_tokens: nn.Module, lm_head: nn.Module) -> DraftBlock:
        """Marginals of the B-1 tokens after `root` (the last committed token, at position cache.seq_len)."""
        if cache.target_hidden is None:
            raise ValueError("the drafter cache is empty: call extend() with the prompt's hidden states first")
        cfg = self.cfg
        device = self.fc.weight.device
        ids = torch.full((1, cfg.block_size), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[0, 0] = root
        positions = torch.arange(cache.seq_len, cache.seq_len + cfg.block_size, device=device)[None]
        context = list(zip(cache.keys, cache.values, strict=True))
        hidden = self(embed_tokens(ids).to(self.fc.weight.dtype), positions, context)[0, 1:]
        return DraftBlock(
            logits=lm_head(hidden.to(lm_head.weight.dtype)), hidden=hidden, target_hidden=cache.target_hidden
        )


def save_drafter(drafter: Drafter, path: str | Path) -> None:
    """Write config.json + model.safetensors in z-lab's DFlash format; each file lands atomically."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    _atomic_write(path / "model.safetensors", lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    text = json.dumps(drafter.cfg.to_hf_dict(), indent=2) + "\n"
    _atomic_write(path / "config.json", lambda tmp: Path(tmp).write_text(text))


def load_drafter(path: str | Path, *, dtype: torch.dtype = torch.float32) -> Drafter:
    """Load a z-lab DFlash folder (config.json + model.safetensors or a sharded index) with strict=True."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json: pass a DFlash checkpoint folder")
    cfg = DrafterConfig.from_hf_dict(json.loads((path / "config.json").read_text()))
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    )
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(path / name)))
    drafter = Drafter(cfg)
    drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return drafter.to(dtype).eval()


def _atomic_write(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
