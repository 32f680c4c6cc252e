"""The Weaver adapter: checkpoint format, norms, table path == module path, tree steps == teacher-forced chain."""

from __future__ import annotations

import pytest
import torch

from weaver.adapter import BiasRMSNorm, CandidatePools, Weaver, WeaverConfig, candidate_pools

V, D_MODEL, D_RANK, HEADS, MLP, LAYERS, DEPTH = 53, 24, 32, 4, 40, 2, 5


def released_config() -> dict:
    """The config dict of a released checkpoint: exactly the keys of the authors' `Weaver(**config)`."""
    return {
        "d_model": D_MODEL,
        "d_embed": D_MODEL,
        "d_rank": D_RANK,
        "num_layers": LAYERS,
        "num_heads": HEADS,
        "mlp_dim": MLP,
        "K": 16,
        "candidate_pool_size": 12,
        "encoder_mode": 3,
        "score_head": 4,
        "activation": "swiglu",
        "rope_base": 10000.0,
    }


def released_state_dict(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Parameter names and shapes of the authors' Weaver, written out independently of weaver.adapter."""
    shapes = {
        "output_norm.weight": (D_MODEL,),
        "output_norm.bias": (D_MODEL,),
        "embed_norm.weight": (D_MODEL,),
        "embed_norm.bias": (D_MODEL,),
        "token_in.weight": (D_RANK, D_MODEL),
        "token_in.bias": (D_RANK,),
        "proposal_in.weight": (D_RANK, D_MODEL),
        "proposal_in.bias": (D_RANK,),
        "out_norm.weight": (D_RANK,),
        "out_norm.bias": (D_RANK,),
        "lm_head_query_in.weight": (D_MODEL, D_RANK),
    }
    for i in range(LAYERS):
        shapes |= {
            f"blocks.{i}.norm_attn.weight": (D_RANK,),
            f"blocks.{i}.norm_attn.bias": (D_RANK,),
            f"blocks.{i}.qkv_proj.weight": (3 * D_RANK, D_RANK),
            f"blocks.{i}.o_proj.weight": (D_RANK, D_RANK),
            f"blocks.{i}.norm_mlp.weight": (D_RANK,),
            f"blocks.{i}.norm_mlp.bias": (D_RANK,),
            f"blocks.{i}.gate_up_proj.weight": (2 * MLP, D_RANK),
            f"blocks.{i}.gate_up_proj.bias": (2 * MLP,),
            f"blocks.{i}.down_proj.weight": (D_RANK, MLP),
            f"blocks.{i}.down_proj.bias": (D_RANK,),
        }
    return {name: 0.2 * torch.randn(shape, generator=generator) for name, shape in shapes.items()}


@pytest.fixture
def weaver() -> Weaver:
    torch.manual_seed(0)
    model = Weaver(WeaverConfig.from_dict(released_config()))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def test_released_checkpoint_loads_strict(tmp_path) -> None:
    state = released_state_dict(torch.Generator().manual_seed(1))
    path = tmp_path / "weaver.pt"
    torch.save({"config": released_config(), "state_dict": state}, path)
    model = Weaver.load(path)
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(state)
    for name, tensor in state.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
    model.save(tmp_path / "again.pt")
    again = torch.load(tmp_path / "again.pt", weights_only=True)
    assert again["config"] == released_config()


def test_checkpoint_errors_name_the_problem(tmp_path) -> None:
    state = released_state_dict(torch.Generator().manual_seed(1))
    del state["blocks.1.down_proj.bias"]
    torch.save({"config": released_config(), "state_dict": state}, tmp_path / "missing.pt")
    with pytest.raises(RuntimeError, match="down_proj.bias"):
        Weaver.load(tmp_path / "missing.pt")
    torch.save(state, tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="not a Weaver checkpoint"):
        Weaver.load(tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="unknown Weaver config keys"):
        WeaverConfig.from_dict(released_config() | {"pos_emb_size": 3})


def test_bias_rmsnorm_in_fp32_with_bias() -> None:
    norm = BiasRMSNorm(8)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = (100 * torch.randn(3, 8)).to(torch.bfloat16)
    xf = x.float()
    expected = xf / (xf.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * norm.weight + norm.bias
    out = norm(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.to(torch.bfloat16).float())


def test_pools_pad_narrow_vocabularies_with_minus_inf() -> None:
    pools = candidate_pools(torch.randn(3, 5), pool_size=8)
    assert pools.ids.shape == (3, 8) and (pools.ids[:, 5:] == -1).all()
    assert torch.isneginf(pools.scores[:, 5:]).all() and torch.isfinite(pools.scores[:, :5]).all()
    assert (pools.scores[:, :-1] >= pools.scores[:, 1:]).all()


def test_table_path_equals_module_path(weaver: Weaver) -> None:
    embed, lm_head = torch.randn(V, D_MODEL), torch.randn(V, D_MODEL)
    tables = weaver.tables(embed, lm_head)
    tokens = torch.tensor([3, 17, 52])
    torch.testing.assert_close(tables.token[tokens], weaver.token_in(weaver.embed_norm(embed[tokens])))
    pools = weaver.pools(torch.randn(DEPTH, V), tables)
    h = torch.randn(DEPTH, D_RANK)
    fast = weaver.pool_logits_from_tables(h, pools.scores, pools.weights)
    slow = weaver.pool_logits(h, CandidatePools(pools.ids, pools.scores), lm_head)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


def test_context_is_causal(weaver: Weaver) -> None:
    target, proposals = torch.randn(1, D_MODEL), torch.randn(1, DEPTH, D_MODEL)
    before = weaver.encode_context(target, proposals)
    proposals[0, -1] += 5.0
    after = weaver.encode_context(target, proposals)
    torch.testing.assert_close(before.keys[:, :, :DEPTH], after.keys[:, :, :DEPTH])
    assert not torch.allclose(before.keys[:, :, DEPTH], after.keys[:, :, DEPTH])


def test_node_steps_equal_teacher_forced_chain(weaver: Weaver) -> None:
    """Expanding a chain node by node (context + ancestors + self) == one causal pass over the chain."""
    from weaver.builders import WeaverSearch

    embed, lm_head = torch.randn(V, D_MODEL), torch.randn(V, D_MODEL)
    block = _Block(torch.randn(DEPTH, V), torch.randn(DEPTH, D_MODEL), torch.randn(D_MODEL))
    adapter = weaver.bind(embed, lm_head)
    chain = [7, 1, 40, 22]  # root, then depths 1..3
    search = WeaverSearch(adapter, block, len(chain))
    stepped = []
    for slot, token in enumerate(chain):
        if slot:
            search.adopt(slot, slot - 1)
        stepped.append(search.expand([slot], [token], [slot])[0])
    context = weaver.encode_context(block.target_hidden[None], block.hidden[None])
    x = weaver.token_in(weaver.embed_norm(embed[torch.tensor(chain)]))[None]
    h, _, _ = weaver.forward_tokens(x, torch.arange(1, len(chain) + 1)[None], context)
    pools = candidate_pools(block.logits[: len(chain)], weaver.config.candidate_pool_size)
    forced = weaver.pool_logits(h[0], pools, lm_head)
    torch.testing.assert_close(torch.stack(stepped), forced, rtol=1e-4, atol=1e-4)


class _Block:
    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor, target_hidden: torch.Tensor) -> None:
        self.logits, self.hidden, self.target_hidden = logits, hidden, target_hidden
