"""The DFlash-style block drafter: shapes, non-causal block, context cache, z-lab checkpoint format."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from weaver.drafter import (
    DraftBlock,
    Drafter,
    DrafterConfig,
    build_target_layer_ids,
    load_drafter,
    save_drafter,
)

V, D_MODEL, N_TARGET = 97, 32, 6


def tiny_config(**overrides) -> DrafterConfig:
    base = dict(
        block_size=5,
        target_layer_ids=(1, 3),
        mask_token_id=V - 1,
        num_target_layers=N_TARGET,
        hidden_size=D_MODEL,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        vocab_size=V,
        rope_theta=10_000.0,
    )
    return DrafterConfig(**{**base, **overrides})


def randomize(module: nn.Module, seed: int = 0) -> None:
    """Random weights everywhere, norms included, so that a wrong name or a missing norm shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))


@pytest.fixture
def drafter() -> Drafter:
    torch.manual_seed(0)
    d = Drafter(tiny_config())
    randomize(d)
    return d.eval()


@pytest.fixture
def target_head() -> tuple[nn.Embedding, nn.Linear]:
    torch.manual_seed(1)
    return nn.Embedding(V, D_MODEL), nn.Linear(D_MODEL, V, bias=False)


def test_build_target_layer_ids_matches_dflash_spacing():
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert build_target_layer_ids(30, 1) == (15,)
    with pytest.raises(ValueError):
        build_target_layer_ids(3, 2)


def test_hidden_layers_include_the_target_last_layer():
    assert tiny_config().hidden_layers == (1, 3, N_TARGET - 1)
    assert tiny_config(target_layer_ids=(2, N_TARGET - 1)).hidden_layers == (2, N_TARGET - 1)


def test_draft_shapes(drafter, target_head):
    cache = drafter.new_cache()
    hidden = torch.randn(7, 3, D_MODEL)
    drafter.extend(cache, hidden)
    block = drafter.draft(cache, root=5, embed_tokens=target_head[0], lm_head=target_head[1])
    assert isinstance(block, DraftBlock)
    assert block.logits.shape == (4, V) and block.hidden.shape == (4, D_MODEL)
    torch.testing.assert_close(block.target_hidden, hidden[-1, 2])
    assert cache.seq_len == 7


def test_extend_rejects_wrong_layer_count(drafter):
    with pytest.raises(ValueError, match="target layers"):
        drafter.extend(drafter.new_cache(), torch.randn(3, 2, D_MODEL))


def test_block_is_non_causal(drafter, target_head):
    """Changing a later block input changes the outputs at earlier block positions."""
    embed = target_head[0].weight
    ctx = drafter.context_kv(torch.randn(1, 6, 2, D_MODEL), torch.arange(6)[None])
    ids = torch.tensor([[3, V - 1, V - 1, V - 1, V - 1]])
    positions = torch.arange(6, 11)[None]
    base = drafter(embed[ids], positions, ctx)
    ids2 = ids.clone()
    ids2[0, 4] = 11
    changed = drafter(embed[ids2], positions, ctx)
    assert (base[0, :4] - changed[0, :4]).abs().max() > 1e-4


def test_context_cache_incremental_equals_recompute(drafter, target_head):
    hidden = torch.randn(12, 3, D_MODEL)
    inc = drafter.new_cache()
    for lo, hi in ((0, 5), (5, 6), (6, 9), (9, 12)):
        drafter.extend(inc, hidden[lo:hi])
    full = drafter.new_cache()
    drafter.extend(full, hidden)
    for a, b in zip(inc.keys + inc.values, full.keys + full.values, strict=True):
        torch.testing.assert_close(a, b)
    emb, head = target_head
    torch.testing.assert_close(drafter.draft(inc, 4, emb, head).logits, drafter.draft(full, 4, emb, head).logits)


def test_masked_forward_equals_per_anchor_forward(drafter, target_head):
    """Training packs many anchor blocks into one pass with a mask; each block must equal its own inference pass."""
    emb = target_head[0].weight
    feats = torch.randn(1, 10, 2, D_MODEL)
    ctx = drafter.context_kv(feats, torch.arange(10)[None])
    anchors, bsz = [3, 7], 5
    ids = torch.full((1, 2 * bsz), V - 1)
    ids[0, 0], ids[0, bsz] = 8, 9
    positions = torch.cat([torch.arange(a, a + bsz) for a in anchors])[None]
    mask = torch.zeros(1, 2 * bsz, 10 + 2 * bsz, dtype=torch.bool)
    for j, a in enumerate(anchors):
        mask[0, j * bsz : (j + 1) * bsz, :a] = True
        mask[0, j * bsz : (j + 1) * bsz, 10 + j * bsz : 10 + (j + 1) * bsz] = True
    packed = drafter(emb[ids], positions, ctx, mask)
    for j, a in enumerate(anchors):
        alone_ctx = drafter.context_kv(feats[:, :a], torch.arange(a)[None])
        alone = drafter(emb[ids[:, j * bsz : (j + 1) * bsz]], positions[:, j * bsz : (j + 1) * bsz], alone_ctx)
        torch.testing.assert_close(packed[:, j * bsz : (j + 1) * bsz], alone, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- z-lab DFlash checkpoint format


def zlab_state_dict(cfg: DrafterConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under z-lab DFlashDraftModel's parameter names (written out here, not taken from our module)."""
    g = torch.Generator().manual_seed(seed)
    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    shapes = {
        "fc.weight": (d, len(cfg.target_layer_ids) * d),
        "hidden_norm.weight": (d,),
        "norm.weight": (d,),
    }
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (cfg.num_heads * hd, d),
            p + "self_attn.k_proj.weight": (cfg.num_kv_heads * hd, d),
            p + "self_attn.v_proj.weight": (cfg.num_kv_heads * hd, d),
            p + "self_attn.o_proj.weight": (d, cfg.num_heads * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, d),
            p + "mlp.up_proj.weight": (inter, d),
            p + "mlp.down_proj.weight": (d, inter),
        }
    return {k: torch.randn(s, generator=g) * 0.3 + (1.0 if len(s) == 1 else 0.0) for k, s in shapes.items()}


def reference_dflash(w, cfg, target_hidden, block_embeds, ctx_positions, block_positions):
    """Plain DFlash forward from raw weights: explicit GQA repeat, explicit softmax; [n, d] in, [B, d] out."""

    def rms(x, weight):
        return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))

    def rope(x, pos):  # x [n, h, hd]
        half = cfg.head_dim // 2
        inv = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float32) * 2 / cfg.head_dim)
        ang = pos[:, None, None].float() * inv
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], dim=-1)

    ctx = rms(target_hidden @ w["fc.weight"].T, w["hidden_norm.weight"])
    all_pos = torch.cat([ctx_positions, block_positions])
    h = block_embeds
    rep = cfg.num_heads // cfg.num_kv_heads
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        kv_in = torch.cat([ctx, x])
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(len(x), cfg.num_heads, cfg.head_dim)
        k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(len(kv_in), cfg.num_kv_heads, cfg.head_dim)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(len(kv_in), cfg.num_kv_heads, cfg.head_dim)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"]), block_positions)
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"]), all_pos).repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / cfg.head_dim**0.5, dim=-1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(len(x), -1)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(x @ w[p + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["norm.weight"])


def write_zlab_checkpoint(path, cfg: DrafterConfig, weights) -> None:
    """A folder as z-lab publishes it: block_size at the top level, the rest under dflash_config, rope_parameters."""
    raw = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        "num_target_layers": cfg.num_target_layers,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "layer_types": ["full_attention"] * cfg.num_layers,
        "attention_bias": False,
        "hidden_act": "silu",
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw))
    save_file(weights, str(path / "model.safetensors"))


def test_zlab_checkpoint_loads_strict_and_matches_reference(tmp_path, target_head):
    cfg = tiny_config()
    weights = zlab_state_dict(cfg, seed=3)
    write_zlab_checkpoint(tmp_path / "ckpt", cfg, weights)
    drafter = load_drafter(tmp_path / "ckpt")
    assert drafter.cfg == cfg
    hidden = torch.randn(9, 3, D_MODEL)
    cache = drafter.new_cache()
    drafter.extend(cache, hidden)
    emb, head = target_head
    block = drafter.draft(cache, root=7, embed_tokens=emb, lm_head=head)
    ids = torch.tensor([7] + [cfg.mask_token_id] * (cfg.block_size - 1))
    ref = reference_dflash(
        weights, cfg, hidden[:, :2].flatten(1), emb.weight[ids], torch.arange(9), torch.arange(9, 9 + cfg.block_size)
    )
    torch.testing.assert_close(block.hidden, ref[1:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(block.logits, head(ref[1:]), rtol=1e-4, atol=1e-4)


def test_save_then_load_round_trip(tmp_path, drafter, target_head):
    save_drafter(drafter, tmp_path / "out")
    raw = json.loads((tmp_path / "out" / "config.json").read_text())
    assert raw["dflash_config"]["target_layer_ids"] == [1, 3] and raw["block_size"] == 5
    loaded = load_drafter(tmp_path / "out")
    assert loaded.cfg == drafter.cfg
    hidden = torch.randn(4, 3, D_MODEL)
    blocks = []
    for d in (drafter, loaded):
        cache = d.new_cache()
        d.extend(cache, hidden)
        blocks.append(d.draft(cache, 2, *target_head).logits)
    torch.testing.assert_close(blocks[0], blocks[1], rtol=0, atol=0)


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"architectures": ["DFlash2DraftModel"]}, "DFlash2DraftModel"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
        ({"dflash_config": {"target_layer_ids": [1, 3]}}, "mask_token_id"),
        ({"num_target_layers": None}, "num_target_layers"),
    ],
    ids=["dflash2", "sliding", "no-mask-token", "no-target-layers"],
)
def test_unsupported_configs_fail_clearly(patch, message):
    raw = tiny_config().to_hf_dict()
    raw.update(patch)
    if raw.get("num_target_layers", 0) is None:
        del raw["num_target_layers"]
    with pytest.raises(ValueError, match=message):
        DrafterConfig.from_hf_dict(raw)
