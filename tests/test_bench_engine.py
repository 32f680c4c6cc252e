"""weaver.bench_engine: a comparison round checks our tokens against transformers'; the verify table times both
weight layouts and leaves the model in the default one."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_hf_model

from weaver.bench_engine import _decode_weights, compare_round, gemv_floor_s, main, verify_ms, verify_table
from weaver.models import from_hf_model


def test_verify_table_times_plain_and_packed_layouts() -> None:
    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model("llama"))
    prefix = list(range(3, 15))
    rows = verify_table(model, prefix, [4, 9])
    assert len(rows) == 4 and rows[2].startswith("| 4 |") and rows[3].startswith("| 9 |")
    assert model.lm_head.packed is not None  # back in the loaders' default layout
    model.prepare_for_inference(pack=False)
    assert model.lm_head.packed is None and model.layers[0].mlp.gate_up_packed is None
    assert verify_ms(model, prefix, 5, repeats=2) > 0


def test_compare_round_matches_transformers_token_for_token() -> None:
    torch.manual_seed(0)
    hf_model = tiny_hf_model("llama")
    model = from_hf_model(hf_model)
    prompts = [list(range(3, 12)), list(range(20, 26))]
    result = compare_round(model, hf_model, prompts, max_new_tokens=6)
    assert result.same_outputs == 2
    assert result.ours_tps > 0 and result.theirs_tps > 0


def test_rounds_must_be_positive(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err


def test_gemv_floor_reads_the_fused_weights_once() -> None:
    torch.manual_seed(0)
    hf_model = tiny_hf_model("llama")
    model = from_hf_model(hf_model)  # the loaders' inference layout: q|k|v and gate|up fused
    weights = _decode_weights(model)
    layer = model.layers[0]
    ids = {id(w) for w in weights}
    assert id(layer.self_attn.qkv_weight) in ids and id(layer.mlp.gate_up_weight) in ids
    assert id(layer.self_attn.q_proj.weight) not in ids and id(layer.mlp.up_proj.weight) not in ids
    hf_weights = _decode_weights(hf_model)  # plain layout: every nn.Linear as stored
    assert sum(w.numel() for w in weights) == sum(w.numel() for w in hf_weights)
    assert len(hf_weights) - len(weights) == 3 * len(model.layers)  # 5 matrices per layer + the head, not 8 + head
    assert gemv_floor_s(model, repeats=2) > 0
