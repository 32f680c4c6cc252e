"""The Weaver adapter: checkpoint format, norms, table path == module path, tree steps == teacher-forced chain;
its training: LK loss, anchored drafting == Drafter.draft, loss decreases on a fixed batch, checkpoint and resume."""

from __future__ import annotations

import random

import pytest
import torch

from weaver.adapter import BiasRMSNorm, CandidatePools, Weaver, WeaverConfig, candidate_pools
from weaver.drafter import Drafter, DrafterConfig
from weaver.training.adapter import (
    OPTIMIZERS,
    AdapterBatch,
    TrainConfig,
    adapter_loss,
    draft_at_anchors,
    lk_loss,
    make_batch,
    make_optimizers,
    new_adapter,
    sample_anchors,
    target_pool_probs,
    train,
    wsd_lr,
)
from weaver.training.muon import Muon

V, D_MODEL, D_RANK, HEADS, MLP, LAYERS, DEPTH = 53, 24, 32, 4, 40, 2, 5


def released_config() -> dict:
    """The config dict of a released checkpoint: exactly the keys of the authors' `Weaver(**config)`.

    Keyword arguments of `Weaver.__init__` in trymirai/sglang python/sglang/srt/speculative/dflash_tfm.py at
    aeac03f0d4c8789559411be95c5c127bdff24d1c (weaver.backends.sglang.FORK_COMMIT); its `Weaver.load` passes the
    config as `Weaver(**config)`, so a missing or extra key fails there.
    """
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
    """Parameter names and shapes of the authors' Weaver, written out independently of weaver.adapter (the fork's
    `Weaver` / `WeaverBlock` / `WeaverRMSNorm` in dflash_tfm.py at the same commit, loaded with strict=True)."""
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
    assert sorted(again) == ["config", "state_dict"]
    assert list(again["config"].items()) == list(released_config().items())
    assert [type(v) for v in again["config"].values()] == [type(v) for v in released_config().values()]
    assert sorted(again["state_dict"]) == sorted(state)


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
    pools = weaver.pools(torch.randn(DEPTH, V))
    h = torch.randn(DEPTH, D_RANK)
    fast = weaver.pool_scores(h, tables, pools.ids, pools.scores)
    slow = weaver.pool_logits(h, CandidatePools(pools.ids, pools.scores), lm_head)
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


def test_module_path_scores_pools_like_gathered_lm_head_rows(weaver: Weaver) -> None:
    """pool_logits scores the distinct pool tokens once; values and gradients equal the direct per-pool gather."""
    lm_head = torch.randn(V, D_MODEL)
    pools = weaver.pools(torch.randn(2, DEPTH, V - 50))  # narrow vocabulary: the pools carry -1 padding
    assert (pools.ids == -1).any() and pools.ids.unique().numel() < pools.ids.numel()
    h = torch.randn(2, DEPTH, D_RANK)

    def direct(h: torch.Tensor) -> torch.Tensor:
        query = weaver.lm_head_query_in(weaver.out_norm(h))
        rows = lm_head[pools.ids.clamp(min=0)]  # [2, DEPTH, K, D_MODEL]
        return pools.scores + (rows @ query[..., None]).squeeze(-1)

    weights = torch.randn(2, DEPTH, pools.ids.shape[-1])
    results = []
    for fn in (lambda h: weaver.pool_logits(h, pools, lm_head), direct):
        weaver.zero_grad()
        hh = h.clone().requires_grad_(True)
        out = fn(hh)
        torch.where(torch.isfinite(out), out * weights, 0.0).sum().backward()
        results.append((out.detach(), hh.grad, weaver.lm_head_query_in.weight.grad.clone()))
    (fast, fast_h, fast_w), (slow, slow_h, slow_w) = results
    assert torch.equal(torch.isneginf(fast), pools.ids == -1)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast_h, slow_h, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast_w, slow_w, rtol=1e-4, atol=1e-5)


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


# ---------------------------------------------------------------------------------------------- training
TRAIN_V, TRAIN_D = 41, 16  # training tests: vocabulary and target width


def tiny_drafter() -> Drafter:
    torch.manual_seed(0)
    cfg = DrafterConfig(
        block_size=5,
        target_layer_ids=(1,),
        mask_token_id=0,
        num_target_layers=4,
        hidden_size=TRAIN_D,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        intermediate_size=32,
        vocab_size=TRAIN_V,
    )
    return Drafter(cfg).eval()


def fake_example(length: int, seed: int, top_k: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    logprobs = torch.log_softmax(2 * torch.randn(length, TRAIN_V, generator=g), -1)
    top_logprobs, top_ids = logprobs.topk(top_k, -1)
    return {
        "ids": torch.randint(1, TRAIN_V, (length,), generator=g),
        "hidden": torch.randn(length, 2, TRAIN_D, generator=g),
        "top_ids": top_ids.to(torch.int32),
        "top_logprobs": top_logprobs,
        "prompt_len": 3,
    }


class FakeStore:
    def __init__(self, examples: list[dict]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def iterate(self, rng: random.Random):
        yield from self.examples


def test_target_pool_probs_matches_dense_reference() -> None:
    probs = torch.softmax(torch.randn(3, TRAIN_V), -1)
    top_p, top_ids = probs.topk(5, -1)
    pool_ids = torch.stack([torch.randperm(TRAIN_V)[:8] for _ in range(3)])
    pool_ids[0, -1] = -1
    dense = torch.zeros(3, TRAIN_V).scatter(1, top_ids, top_p)
    expected = torch.where(pool_ids >= 0, dense.gather(1, pool_ids.clamp(min=0)), 0.0)
    torch.testing.assert_close(target_pool_probs(pool_ids, top_ids, top_p.log()), expected)


def test_lk_loss_zero_at_target_and_outside_mass_is_rejection() -> None:
    pool_ids = torch.tensor([[3, 7, 9, -1]])
    target_ids, target_lp = torch.tensor([[3, 7, 9]]), torch.tensor([[0.5, 0.3, 0.2]]).log()
    logits = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).log()
    logits[0, -1] = float("-inf")
    loss, parts = lk_loss(logits, pool_ids, target_ids, target_lp, kl_weight=0.5)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    # half of the target's mass leaves the pool: at best half is accepted, and the KL sees the in-pool part only
    _, parts = lk_loss(
        logits, pool_ids, torch.tensor([[3, 7, 9, 20]]), torch.tensor([[0.25, 0.15, 0.1, 0.5]]).log(), 0.5
    )
    assert parts["acceptance"].item() == pytest.approx(0.5, abs=1e-6)
    assert parts["kl"].item() == pytest.approx(0.0, abs=1e-6)
    assert parts["pool_mass"].item() == pytest.approx(0.5, abs=1e-6)


def test_draft_at_anchors_equals_drafter_draft() -> None:
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    example = fake_example(12, seed=1)
    anchors = [3, 7]
    logits, hidden, target_hidden = draft_at_anchors(drafter, example, anchors, embed, lm_head)
    for row, anchor in enumerate(anchors):
        cache = drafter.new_cache()
        drafter.extend(cache, example["hidden"][:anchor])
        block = drafter.draft(
            cache, int(example["ids"][anchor]), torch.nn.Embedding.from_pretrained(embed), _Linear(lm_head)
        )
        torch.testing.assert_close(logits[row], block.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(hidden[row], block.hidden, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(target_hidden[row], block.target_hidden)


def _Linear(weight: torch.Tensor) -> torch.nn.Linear:
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight.data.copy_(weight)
    return layer


def test_sample_anchors_stay_in_the_completion() -> None:
    anchors = sample_anchors(20, prompt_len=6, count=50, rng=random.Random(0))
    assert anchors == list(range(5, 19))
    assert sample_anchors(3, prompt_len=3, count=2, rng=random.Random(0)) == []


@pytest.mark.parametrize(("name", "lr"), [("adamw", 3e-3), ("muon", 1e-2)])
def test_few_steps_reduce_the_loss_on_a_fixed_batch(name: str, lr: float) -> None:
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    batch = make_batch(drafter, fake_example(16, seed=2), [3, 6, 9, 12], embed, lm_head, pool_size=12)
    assert isinstance(batch, AdapterBatch) and batch.valid.sum() > 8
    torch.manual_seed(0)
    weaver = new_adapter(TRAIN_D, TRAIN_D, d_rank=32, num_layers=1, num_heads=4, mlp_dim=48, pool_size=12)
    optimizers = make_optimizers(weaver, TrainConfig(lr=lr, optimizer=name))
    if name == "muon":  # the matrices under Muon, every other parameter (norm gains and biases) under AdamW
        assert isinstance(optimizers[0], Muon) and isinstance(optimizers[1], torch.optim.AdamW)
        assert {p.ndim for g in optimizers[0].param_groups for p in g["params"]} == {2}
        assert 2 not in {p.ndim for g in optimizers[1].param_groups for p in g["params"]}
    assert sum(p.numel() for o in optimizers for g in o.param_groups for p in g["params"]) == sum(
        p.numel() for p in weaver.parameters()
    )
    losses = []
    for _ in range(40):
        loss, stats = adapter_loss(weaver, batch, embed, lm_head, kl_weight=0.5)
        for optimizer in optimizers:
            optimizer.zero_grad()
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()
        losses.append(stats.loss)
    assert losses[-1] < 0.7 * losses[0]


def test_unknown_optimizer_is_refused() -> None:
    with pytest.raises(ValueError, match="optimizer must be one of"):
        TrainConfig(optimizer="sgd")


def test_zero_init_adapter_is_the_drafter_prior() -> None:
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    batch = make_batch(drafter, fake_example(16, seed=3), [4, 8], embed, lm_head, pool_size=12)
    weaver = new_adapter(TRAIN_D, TRAIN_D, d_rank=32, num_layers=1, num_heads=4, mlp_dim=48, pool_size=12)
    context = weaver.encode_context(batch.target_hidden, batch.proposal_hidden)
    h, _, _ = weaver.forward_tokens(weaver.token_in(weaver.embed_norm(embed[batch.chain])), torch.ones(2, 4), context)
    logits = weaver.pool_logits(h, CandidatePools(batch.pool_ids, batch.pool_scores), lm_head)
    torch.testing.assert_close(logits, batch.pool_scores)


def test_wsd_schedule() -> None:
    lrs = [wsd_lr(s, 100, 1.0, 10, 0.2) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0) and lrs[50] == 1.0
    assert lrs[85] == pytest.approx(0.75) and lrs[99] == pytest.approx(0.05)


def test_new_adapter_writes_the_drafter_depth_as_k() -> None:
    """The fork drafts min(block_size - 1, K) depths: K is the drafter's D, not the pool size."""
    weaver = new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=10, depth=7)
    assert (weaver.config.K, weaver.config.candidate_pool_size) == (7, 10)
    assert new_adapter(TRAIN_D, TRAIN_D, 16, 1, 2, 24, pool_size=10).config.K == 15  # the paper's block-16 drafters


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_train_writes_a_strict_checkpoint_and_resumes(tmp_path, optimizer: str) -> None:
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    store = FakeStore([fake_example(14, seed=s) for s in range(3)])
    cfg = TrainConfig(
        steps=3, seqs_per_step=2, anchors_per_seq=2, warmup=1, pool_size=10, save_every=2, optimizer=optimizer
    )
    weaver = new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=10)
    history = train(weaver, drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None)
    assert len(history) == 3
    loaded = Weaver.load(tmp_path / "adapter.pt")
    for name, tensor in weaver.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    more = TrainConfig(**{**cfg.__dict__, "steps": 5})
    messages = []
    history = train(loaded, drafter, store, embed, lm_head, more, tmp_path, log=messages.append)
    assert len(history) == 2 and "resuming at step 3" in messages[0]
    assert [m for m in messages if "drafting chains" in m] == [
        f"adapter: drafting chains, {n}/3 sequences" for n in (1, 2)
    ]
    assert torch.load(tmp_path / "train_state.pt", weights_only=True)["step"] == 5


def test_resume_restores_weights_from_the_state_and_rewrites_a_deleted_adapter(tmp_path) -> None:
    """What a workflow rerun does: adapter.pt deleted, train_state.pt kept; a fresh module must not be saved."""
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    store = FakeStore([fake_example(14, seed=s) for s in range(3)])
    cfg = TrainConfig(steps=2, seqs_per_step=2, anchors_per_seq=2, warmup=1, pool_size=10)
    trained = new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=10)
    train(trained, drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None)
    (tmp_path / "adapter.pt").unlink()
    fresh = new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=10)
    assert train(fresh, drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None) == []
    rewritten = Weaver.load(tmp_path / "adapter.pt").state_dict()
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(rewritten[name], tensor)


def test_resume_refuses_other_settings_or_restarts_when_asked(tmp_path) -> None:
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    store = FakeStore([fake_example(14, seed=s) for s in range(3)])
    cfg = TrainConfig(steps=2, seqs_per_step=2, anchors_per_seq=2, warmup=1, pool_size=10)

    def adapter(pool_size: int = 10) -> Weaver:
        return new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=pool_size)

    train(adapter(), drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None)
    bigger_pools = TrainConfig(**{**cfg.__dict__, "pool_size": 12})
    with pytest.raises(ValueError, match=r"pool_size: 10 -> 12.*--restart-if-changed"):
        train(adapter(12), drafter, store, embed, lm_head, bigger_pools, tmp_path, log=lambda _: None)
    with pytest.raises(ValueError, match="architecture candidate_pool_size: 10 -> 12"):
        train(adapter(12), drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None)
    with pytest.raises(ValueError, match="at step 2, beyond --steps 1"):
        shorter = TrainConfig(**{**cfg.__dict__, "steps": 1, "pool_size": 12})
        train(adapter(12), drafter, store, embed, lm_head, shorter, tmp_path, restart_if_changed=True)
    messages: list[str] = []
    history = train(
        adapter(12), drafter, store, embed, lm_head, bigger_pools, tmp_path, messages.append, restart_if_changed=True
    )
    assert len(history) == 2 and "training from scratch" in messages[0]
    stale = list(tmp_path.glob("train_state.stale-*.pt"))
    assert len(stale) == 1 and torch.load(stale[0], weights_only=True)["train_config"]["pool_size"] == 10
    assert Weaver.load(tmp_path / "adapter.pt").config.candidate_pool_size == 12


def test_resume_refuses_a_state_trained_against_another_drafter_or_target(tmp_path) -> None:
    """Same configs, other inputs (a retrained drafter, a rebuilt target): resuming would keep the stale adapter."""
    drafter = tiny_drafter()
    embed, lm_head = torch.randn(TRAIN_V, TRAIN_D), torch.randn(TRAIN_V, TRAIN_D)
    store = FakeStore([fake_example(14, seed=s) for s in range(3)])
    cfg = TrainConfig(steps=2, seqs_per_step=2, anchors_per_seq=2, warmup=1, pool_size=10)

    def adapter() -> Weaver:
        return new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=10)

    train(adapter(), drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None)
    assert train(adapter(), drafter, store, embed, lm_head, cfg, tmp_path, log=lambda _: None) == []  # same inputs
    retrained = tiny_drafter()
    with torch.no_grad():
        next(retrained.parameters()).add_(1e-3)
    with pytest.raises(ValueError, match=r"input drafter: '[0-9a-f]{16}' -> '[0-9a-f]{16}'"):
        train(adapter(), retrained, store, embed, lm_head, cfg, tmp_path, log=lambda _: None)
    with pytest.raises(ValueError, match="input target_embed_head"):
        train(adapter(), drafter, store, embed, lm_head + 1, cfg, tmp_path, log=lambda _: None)
    messages: list[str] = []
    history = train(
        adapter(), retrained, store, embed, lm_head, cfg, tmp_path, messages.append, restart_if_changed=True
    )
    assert len(history) == 2 and "training from scratch" in messages[0]


def test_cli_refuses_to_overwrite_a_foreign_adapter(tmp_path) -> None:
    from weaver.train import main

    adapter = new_adapter(TRAIN_D, TRAIN_D, d_rank=16, num_layers=1, num_heads=2, mlp_dim=24, pool_size=10)
    adapter.save(tmp_path / "adapter.pt")
    argv = ["adapter", "--model", "no-such-model", "--drafter", str(tmp_path), "--out", str(tmp_path)]
    with pytest.raises(ValueError, match="adapter.pt but no train_state.pt"):
        main(argv)
