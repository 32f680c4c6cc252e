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


def tiny_drafter(model, block_size: int = 8, seed: int = 3):
    """A random one-layer block drafter for `model` (a weaver Transformer), tapping its layers as DFlash does."""
    from weaver.drafter import Drafter, DrafterConfig, build_target_layer_ids

    cfg = model.config
    torch.manual_seed(seed)
    config = DrafterConfig(
        block_size=block_size,
        target_layer_ids=build_target_layer_ids(cfg.num_hidden_layers, 1),
        mask_token_id=0,
        hidden_size=cfg.hidden_size,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=cfg.vocab_size,
        num_target_layers=cfg.num_hidden_layers,
    )
    return Drafter(config).eval()


def tiny_adapter(model, pool_size: int = 16, residual: float = 0.5):
    """A random Weaver adapter for `model`; `residual` > 0 makes its trees differ from the drafter's marginals."""
    from weaver.adapter import Weaver, WeaverConfig

    cfg = model.config
    config = WeaverConfig(
        d_model=cfg.hidden_size,
        d_embed=cfg.hidden_size,
        d_rank=32,
        num_layers=1,
        num_heads=4,
        mlp_dim=64,
        K=pool_size,
        candidate_pool_size=pool_size,
    )
    adapter = Weaver(config).eval()
    with torch.no_grad():
        adapter.lm_head_query_in.weight.normal_(0, residual) if residual else adapter.lm_head_query_in.weight.zero_()
    return adapter
