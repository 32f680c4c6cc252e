"""The Weaver step kernels (METHOD.md section 3): references against an explicit per-node loop, Triton against the
references (fp32; under TRITON_INTERPRET=1 on CPU, natively on a GPU) with NaN-poisoned buffers, odd sizes, padding
entries, W = 1 and W > 1, a single context token, nodes without ancestors, GQA ratios 1 and 2, batches."""

from __future__ import annotations

import csv

import pytest
import torch
import weaver_kernels as wk
from kernel_inputs import assert_close

pytestmark = pytest.mark.usefixtures("nan_poison")

TOL = 1e-5


def both(op, *args):
    """(fast path, reference) of one public op on the same args."""
    with wk.use_backend("triton"):
        fast = getattr(wk, op)(*args)
    with wk.use_backend("ref"):
        ref = getattr(wk, op)(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
    return fast, ref


def node_slots(w: int, m: int, a: int, gen: torch.Generator) -> torch.Tensor:
    """[w, a] distinct slots in [0, m) per node with random -1 padding anywhere in the row (a <= m)."""
    rows = []
    for _ in range(w):
        row = torch.randperm(m, generator=gen)[:a]
        row[torch.rand(a, generator=gen) < 0.3] = -1
        rows.append(row)
    return torch.stack(rows) if rows and a else torch.zeros(w, a, dtype=torch.long)


def attention_inputs(w, c, m, a, hkv, rep, dh, gen, batch=()):
    q = torch.randn(*batch, w, hkv * rep, dh, generator=gen)
    ctx_k, ctx_v, node_k, node_v = (torch.randn(*batch, n, hkv, dh, generator=gen) for n in (c, c, m, m))
    slots = torch.stack([node_slots(w, m, a, gen) for _ in range(max(1, *batch) if batch else 1)])
    return q, ctx_k, ctx_v, node_k, node_v, slots if batch else slots[0]


def loop_attention(q, ctx_k, ctx_v, node_k, node_v, slots):
    """Each node and head on its own: softmax over the explicit list context + valid slots."""
    out = torch.zeros_like(q, dtype=torch.float64)
    rep = q.shape[1] // ctx_k.shape[1]
    for i in range(q.shape[0]):
        seen = [int(s) for s in slots[i] if s >= 0]
        for h in range(q.shape[1]):
            keys = torch.cat([ctx_k[:, h // rep], node_k[seen, h // rep]]).double()
            vals = torch.cat([ctx_v[:, h // rep], node_v[seen, h // rep]]).double()
            weights = torch.softmax(keys @ q[i, h].double() / q.shape[-1] ** 0.5, dim=0)
            out[i, h] = weights @ vals
    return out.float()


ATTENTION_CASES = [
    pytest.param(1, 1, 1, 1, 1, 2, id="W1-C1-selfonly"),
    pytest.param(1, 5, 9, 0, 2, 1, id="W1-noslots"),
    pytest.param(7, 1, 13, 5, 2, 2, id="W7-C1-gqa2"),
    pytest.param(17, 6, 33, 16, 3, 1, id="W17-A16"),
    pytest.param(32, 16, 129, 17, 2, 2, id="W32-C16-A17-gqa2"),
]


@pytest.mark.parametrize("w,c,m,a,hkv,rep", ATTENTION_CASES)
def test_step_attention_ref_is_a_per_node_softmax(w, c, m, a, hkv, rep):
    args = attention_inputs(w, c, m, a, hkv, rep, 8, torch.Generator().manual_seed(w + a))
    assert_close(wk.weaver_step_attention_ref(*args), loop_attention(*args), 1e-6, "ref vs loop")


@pytest.mark.parametrize("w,c,m,a,hkv,rep", ATTENTION_CASES)
def test_step_attention_triton_matches_ref(w, c, m, a, hkv, rep, device):
    args = attention_inputs(w, c, m, a, hkv, rep, 24, torch.Generator().manual_seed(w * c))
    fast, ref = both("weaver_step_attention", *(x.to(device) for x in args))
    assert_close(fast.cpu(), ref, TOL, "step attention")


def test_step_attention_batched(device):
    args = attention_inputs(5, 3, 11, 6, 2, 2, 16, torch.Generator().manual_seed(3), batch=(2,))
    fast, ref = both("weaver_step_attention", *(x.to(device) for x in args))
    assert_close(fast.cpu(), ref, TOL, "batched step attention")
    assert_close(ref[1], wk.weaver_step_attention_ref(*(x[1] for x in args)), 1e-6, "batch item")


def test_step_attention_ignores_padding_and_unlisted_slots():
    gen = torch.Generator().manual_seed(4)
    q, ctx_k, ctx_v, node_k, node_v, _ = attention_inputs(3, 4, 10, 4, 2, 1, 8, gen)
    slots = torch.tensor([[2, -1, 5, -1], [-1, -1, -1, 0], [9, 1, 3, 7]])
    before = wk.weaver_step_attention_ref(q, ctx_k, ctx_v, node_k, node_v, slots)
    node_k[[4, 6, 8]] += 100.0  # slots that no node lists
    assert_close(wk.weaver_step_attention_ref(q, ctx_k, ctx_v, node_k, node_v, slots), before, 1e-7, "unlisted")
    node_k[5] += 1.0
    after = wk.weaver_step_attention_ref(q, ctx_k, ctx_v, node_k, node_v, slots)
    assert not torch.allclose(after[0], before[0]) and torch.equal(after[1:], before[1:])


def score_inputs(w, k, v, r, gen, batch=()):
    query = torch.randn(*batch, w, r, generator=gen)
    table = torch.randn(v, r, generator=gen)
    ids = torch.randint(0, v, (*batch, w, k), generator=gen)
    ids[torch.rand(ids.shape, generator=gen) < 0.2] = -1
    logits = torch.randn(*batch, w, k, generator=gen)
    return query, table, ids, logits


SCORE_CASES = [
    pytest.param(1, 1, 3, 5, id="W1-K1"),
    pytest.param(1, 63, 101, 17, id="W1-K63"),
    pytest.param(7, 65, 50, 130, id="W7-K65-R130"),
    pytest.param(32, 129, 300, 64, id="W32-K129"),
]


@pytest.mark.parametrize("w,k,v,r", SCORE_CASES)
def test_step_scores_ref_is_the_pool_formula(w, k, v, r):
    query, table, ids, logits = score_inputs(w, k, v, r, torch.Generator().manual_seed(k))
    out = wk.weaver_step_scores_ref(query, table, ids, logits)
    for i in range(w):
        for j in range(k):
            want = float("-inf") if ids[i, j] < 0 else float(logits[i, j] + table[ids[i, j]] @ query[i])
            assert out[i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("w,k,v,r", SCORE_CASES)
def test_step_scores_triton_matches_ref(w, k, v, r, device):
    query, table, ids, logits = (x.to(device) for x in score_inputs(w, k, v, r, torch.Generator().manual_seed(w)))
    fast, ref = both("weaver_step_scores", query, table, ids, logits)
    padding = ids.cpu() < 0
    assert torch.equal(torch.isneginf(fast.cpu()), padding) and torch.equal(torch.isneginf(ref), padding)
    assert_close(fast.cpu()[~padding], ref[~padding], TOL, "pool scores")


def test_step_scores_batched(device):
    query, table, ids, logits = (x.to(device) for x in score_inputs(4, 33, 40, 24, torch.Generator(), batch=(3,)))
    ids[..., 0] = 0  # every row keeps a finite entry
    fast, ref = both("weaver_step_scores", query, table, ids, logits)
    finite = ids.cpu() >= 0
    assert_close(fast.cpu()[finite], ref[finite], TOL, "batched pool scores")


def test_bad_shapes_name_the_problem():
    gen = torch.Generator().manual_seed(0)
    q, ctx_k, ctx_v, node_k, node_v, slots = attention_inputs(2, 3, 5, 2, 2, 1, 8, gen)
    with pytest.raises(ValueError, match="at least one token"):
        wk.weaver_step_attention_ref(q, ctx_k[:0], ctx_v[:0], node_k, node_v, slots)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        wk.weaver_step_attention_ref(q[:, :1].expand(2, 3, 8), ctx_k, ctx_v, node_k, node_v, slots)
    with pytest.raises(ValueError, match="slots must be int64"):
        wk.weaver_step_attention_ref(q, ctx_k, ctx_v, node_k, node_v, slots.int())
    query, table, ids, logits = score_inputs(2, 4, 9, 6, gen)
    with pytest.raises(ValueError, match=r"table must be \[V, d_rank\]"):
        wk.weaver_step_scores_ref(query, table[:, :5], ids, logits)
    with pytest.raises(ValueError, match="pool_ids must be int64"):
        wk.weaver_step_scores_ref(query, table, ids.int(), logits)


def test_bench_has_a_weaver_step_row(tmp_path):
    from weaver_kernels import bench

    bench.main(["--device", "cpu", "--layouts", "weaver-step", "--n", "17", "--repeats", "1", "--out", str(tmp_path)])
    (row,) = csv.DictReader((tmp_path / "kernel_table.csv").open())
    assert (row["layout"], row["n"], row["backend"]) == ("weaver-step", "17", "ref")
    assert float(row["per_branch_us"]) > 0 and float(row["fused_us"]) > 0
