"""weaver.bench_engine: the verify table times both weight layouts and leaves the model in the default one."""

from __future__ import annotations

import torch
from tiny_models import tiny_hf_model

from weaver.bench_engine import verify_ms, verify_table
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
