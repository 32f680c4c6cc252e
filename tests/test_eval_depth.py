"""Figure-4 measurement (weaver.eval_depth) on a tiny random target, drafter and adapter."""

from __future__ import annotations

import csv

import pytest
import torch
from tiny_models import tiny_hf_model

from weaver.adapter import Weaver, WeaverConfig
from weaver.drafter import Drafter, DrafterConfig, build_target_layer_ids
from weaver.eval_depth import evaluate, pick_anchors, rows_for, sequence_acceptance, write_csv
from weaver.models import from_hf_model


@pytest.fixture(scope="module")
def setup() -> tuple:
    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model("llama")).eval()
    cfg = model.config
    drafter = Drafter(
        DrafterConfig(
            block_size=6,
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
    ).eval()
    with torch.no_grad():  # sharper marginals than the random init gives, so argmax and sample differ clearly
        drafter.norm.weight.mul_(8.0)
    return model, drafter


def make_adapter(model, pool_size: int, residual: float) -> Weaver:
    cfg = model.config
    adapter = Weaver(
        WeaverConfig(
            d_model=cfg.hidden_size,
            d_embed=cfg.hidden_size,
            d_rank=32,
            num_layers=1,
            num_heads=4,
            mlp_dim=64,
            K=pool_size,
            candidate_pool_size=pool_size,
        )
    ).eval()
    with torch.no_grad():
        adapter.lm_head_query_in.weight.normal_(0, residual) if residual else adapter.lm_head_query_in.weight.zero_()
    return adapter


def sequence(length: int = 20) -> torch.Tensor:
    return torch.randint(1, 97, (length,), generator=torch.Generator().manual_seed(5))


def test_matches_per_anchor_drafts_against_the_dense_target(setup) -> None:
    """Reference: Drafter.draft from a cache of the context x_<L, and the target's softmax at L + d - 1."""
    model, drafter = setup
    ids, anchors = sequence(), [4, 9, 17]
    acc = sequence_acceptance(model, drafter, None, ids, anchors, temperature=1.0)
    with torch.no_grad():
        out = model(ids[None], hidden_layers=drafter.hidden_layers)
    p_all = torch.softmax(out.logits[0].double(), -1)
    for row, anchor in enumerate(anchors):
        cache = drafter.new_cache()
        drafter.extend(cache, out.hidden[0, :anchor])
        with torch.no_grad():
            block = drafter.draft(cache, int(ids[anchor]), model.embed_tokens, model.lm_head)
        for d in range(1, drafter.cfg.block_size):
            if anchor + d - 1 >= ids.numel():
                assert not acc["valid"][row, d - 1]
                continue
            p, q = p_all[anchor + d - 1], torch.softmax(block.logits[d - 1].double(), -1)
            assert acc["valid"][row, d - 1]
            assert acc["argmax"][row, d - 1].item() == pytest.approx(p[q.argmax()].item(), rel=1e-4)
            assert acc["sample"][row, d - 1].item() == pytest.approx((p * q).sum().item(), rel=1e-4)


def test_zero_residual_weaver_over_the_full_vocabulary_is_the_marginal(setup) -> None:
    model, drafter = setup
    adapter = make_adapter(model, pool_size=model.config.vocab_size, residual=0.0)
    acc = sequence_acceptance(model, drafter, adapter, sequence(), [5, 11], temperature=1.0)
    torch.testing.assert_close(acc["weaver_argmax"], acc["argmax"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(acc["weaver_sample"], acc["sample"], rtol=1e-4, atol=1e-6)
    trained = make_adapter(model, pool_size=16, residual=0.5)
    moved = sequence_acceptance(model, drafter, trained, sequence(), [5, 11], temperature=1.0)
    assert not torch.allclose(moved["weaver_sample"], acc["sample"])


def test_greedy_target_scores_argmax_as_a_hit_or_a_miss(setup) -> None:
    model, drafter = setup
    acc = sequence_acceptance(model, drafter, None, sequence(), [3, 8], temperature=0.0)
    hits = acc["argmax"][acc["valid"]]
    assert set(hits.unique().tolist()) <= {0.0, 1.0}
    assert (acc["sample"] <= 1.0 + 1e-6).all() and (acc["sample"] >= 0).all()


def test_anchors_lie_in_the_continuation() -> None:
    gen = torch.Generator().manual_seed(0)
    anchors = pick_anchors(prompt_len=6, length=12, count=50, generator=gen)
    assert anchors == list(range(5, 11))
    assert pick_anchors(prompt_len=6, length=6, count=4, generator=gen) == []


def test_evaluate_writes_one_row_per_draft_and_depth(setup, tmp_path) -> None:
    model, drafter = setup
    adapter = make_adapter(model, pool_size=16, residual=0.5)
    prompts = [sequence(7).tolist(), sequence(9).tolist()]
    result = evaluate(model, drafter, adapter, prompts, 1.0, max_new_tokens=10, anchors_per_seq=4, eos_id=None)
    rows = rows_for("tiny", "synthetic", 1.0, result)
    assert {r.draft for r in rows} == {"argmax", "sample", "weaver_argmax", "weaver_sample"}
    assert {r.depth for r in rows} == set(range(1, drafter.cfg.block_size))
    assert all(0.0 <= r.acceptance <= 1.0 and r.n > 0 for r in rows)
    write_csv(tmp_path / "depth.csv", rows)
    with (tmp_path / "depth.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and float(table[0]["acceptance"]) == pytest.approx(rows[0].acceptance)
