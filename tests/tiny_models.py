"""Tiny random targets of every family for fp32 CPU tests (imported by tests as `tiny_models`)."""

from __future__ import annotations

import torch

TINY_FAMILIES = ("llama", "qwen3", "qwen3_next", "qwen3_5_text")


def tiny_hf_config(family: str, **overrides):
    """A transformers config of `family` small enough for fp32 CPU tests (odd head dims, GQA, a 3:1 hybrid)."""
    from transformers import AutoConfig

    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=family == "llama",
    )
    if family in ("qwen3_next", "qwen3_5_text"):
        base.update(
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=12,
            linear_conv_kernel_dim=4,
            partial_rotary_factor=0.5,
        )
    if family == "qwen3_next":
        base.update(num_experts=0)
    base.update(overrides)
    return AutoConfig.for_model(family, **base)


def tiny_hf_model(family: str, **overrides) -> torch.nn.Module:
    """transformers' model of a tiny config with every norm weight perturbed (so norms are not identities)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_hf_config(family, **overrides)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model
