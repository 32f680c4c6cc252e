"""ModelConfig: the one frozen description of a target, read from a Hugging Face config.json.

Families (model_type in config.json):
    llama          SmolLM2 / Llama attention models
    qwen3          + RMSNorm of q and k per head
    qwen3_next     hybrid: Gated DeltaNet + gated full attention, zero-centred RMSNorm (1 + w), partial RoPE;
                   dense MLP only (num_experts = 0 or every layer in mlp_only_layers)
    qwen3_5_text   the same hybrid with separate GDN in-projections (qkv, z, b, a); qwen3_5 reads its text_config
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAMILIES = ("llama", "qwen3", "qwen3_next", "qwen3_5_text", "qwen3_5")
HYBRIDS = ("qwen3_next", "qwen3_5_text")
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one decoder; every size the modules need, nothing else."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    layer_types: tuple[str, ...]
    linear_conv_kernel_dim: int = 4
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0

    @property
    def qk_norm(self) -> bool:
        """Qwen3 and the hybrids RMS-normalise q and k per head before RoPE."""
        return self.family != "llama"

    @property
    def hybrid(self) -> bool:
        """Qwen3-Next / Qwen3.5 conventions: gated attention (q_proj doubled), zero-centred RMSNorm (1 + w)."""
        return self.family in HYBRIDS

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Read a config.json dict (or `PretrainedConfig.to_dict()`); clear errors for what is not supported."""
        model_type = hf.get("model_type")
        if model_type == "qwen3_5":  # the multimodal wrapper: the decoder lives in text_config
            hf = {"tie_word_embeddings": hf.get("tie_word_embeddings", False), **hf["text_config"]}
            model_type = "qwen3_5_text"
        if model_type not in FAMILIES:
            raise ValueError(f"unsupported model_type {model_type!r}: supported families are {', '.join(FAMILIES)}")
        _check_supported(model_type, hf)
        hybrid = model_type in HYBRIDS
        rope = hf.get("rope_parameters") or {}
        n_layers = hf["num_hidden_layers"]
        default_rotary = 0.25 if hybrid else 1.0  # Qwen3-Next / Qwen3.5 rotate a quarter of each head
        heads = hf["num_attention_heads"]
        return cls(
            family=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf["rms_norm_eps"],
            rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            partial_rotary_factor=rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", default_rotary)),
            max_position_embeddings=hf["max_position_embeddings"],
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            mlp_bias=hf.get("mlp_bias", False),
            layer_types=tuple(hf.get("layer_types") or _default_layer_types(model_type, n_layers, hf)),
            linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
            linear_num_key_heads=hf.get("linear_num_key_heads", 0),
            linear_num_value_heads=hf.get("linear_num_value_heads", 0),
            linear_key_head_dim=hf.get("linear_key_head_dim", 0),
            linear_value_head_dim=hf.get("linear_value_head_dim", 0),
        )


def _default_layer_types(model_type: str, n_layers: int, hf: dict[str, Any]) -> list[str]:
    """Attention-only families are all full attention; hybrids put one attention layer every `interval` (3:1)."""
    if model_type not in HYBRIDS:
        return [FULL_ATTENTION] * n_layers
    interval = hf.get("full_attention_interval", 4)
    return [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n_layers)]


def _check_supported(model_type: str, hf: dict[str, Any]) -> None:
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported: only the default RoPE is implemented")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf.get('hidden_act')!r} is not supported: only SiLU-gated MLPs are implemented")
    if hf.get("use_sliding_window"):
        raise ValueError("sliding-window attention is not supported: set use_sliding_window to false")
    if model_type == "qwen3_next" and hf.get("num_experts", 0) > 0:
        dense = set(hf.get("mlp_only_layers") or [])
        step = hf.get("decoder_sparse_step", 1)
        moe = [i for i in range(hf["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]
        if moe:
            raise ValueError(
                f"qwen3_next layers {moe} are mixture-of-experts, which is not supported: use a dense config "
                "(num_experts = 0, or list every layer in mlp_only_layers)"
            )
