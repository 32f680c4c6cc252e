"""Weaver.step + Weaver.pool_scores (the `weaver_kernels` step, METHOD.md section 3) == the module path that
`forward_tokens` + the module path `pool_logits` take, for batches of tree nodes with different ancestors."""

from __future__ import annotations

import pytest
import torch

from weaver.adapter import CandidatePools, ContextKV, Weaver, WeaverConfig

V, D_MODEL, D_RANK, HEADS, MLP, LAYERS, DEPTH, POOL = 61, 24, 32, 4, 40, 2, 5, 9


@pytest.fixture
def weaver() -> Weaver:
    torch.manual_seed(0)
    config = WeaverConfig(D_MODEL, D_MODEL, D_RANK, LAYERS, HEADS, MLP, K=16, candidate_pool_size=POOL)
    model = Weaver(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def module_step(weaver, context, node_keys, node_values, x, depths, ancestors):
    """The existing path: per-row gathered ancestor K/V as memory, then each node's own token."""
    w, a = len(ancestors), max(1, max(len(anc) for anc in ancestors))
    idx = torch.zeros(w, a, dtype=torch.long)
    mask = torch.zeros(w, 1, a, dtype=torch.bool)
    for row, anc in enumerate(ancestors):
        idx[row, : len(anc)] = torch.tensor(anc, dtype=torch.long)
        mask[row, 0, : len(anc)] = True
    rows = ContextKV(context.keys.expand(-1, w, -1, -1, -1), context.values.expand(-1, w, -1, -1, -1))
    h, k, v = weaver.forward_tokens(
        x[:, None], (depths + 1)[:, None], rows, node_keys[:, idx], node_values[:, idx], mask, torch.ones(1, 1).bool()
    )
    return h[:, 0], k[:, :, 0], v[:, :, 0]


@torch.no_grad()
def test_step_equals_forward_tokens_over_a_tree(weaver: Weaver) -> None:
    gen = torch.Generator().manual_seed(1)
    lm_head = torch.randn(V, D_MODEL, generator=gen)
    tables = weaver.tables(torch.randn(V, D_MODEL, generator=gen), lm_head)
    pools = weaver.pools(torch.randn(DEPTH, V, generator=gen), POOL)
    pools.ids[2, -3:] = -1  # padding entries score -inf on both paths
    pools.scores[2, -3:] = float("-inf")
    context = weaver.encode_context(
        torch.randn(1, D_MODEL, generator=gen), torch.randn(1, DEPTH, D_MODEL, generator=gen)
    )
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 5]  # expanded in batches {0}, {1, 2}, {3, 4, 5}, {6, 7, 8}
    depth = [0, 1, 1, 2, 2, 2, 3, 3, 3]
    tokens = torch.randint(0, V, (len(parents),), generator=gen)
    kv_fast = torch.zeros(2, LAYERS, len(parents), HEADS, D_RANK // HEADS)
    kv_ref = torch.zeros_like(kv_fast)
    for batch in ([0], [1, 2], [3, 4, 5], [6, 7, 8]):
        ancestors = [_ancestors(parents, s) for s in batch]
        slots, depths = torch.tensor(batch), torch.tensor([depth[s] for s in batch])
        x = tables.token[tokens[slots]]
        seen = torch.full((len(batch), 4), -1, dtype=torch.long)  # padding at the end and in the middle
        for row, (s, anc) in enumerate(zip(batch, ancestors, strict=True)):
            seen[row, [*range(len(anc)), 3][: len(anc) + 1]] = torch.tensor([*anc, s])
        h = weaver.step(x, depths, context, kv_fast[0], kv_fast[1], slots, seen)
        logits = weaver.pool_scores(h, tables, pools.ids[depths], pools.scores[depths])
        h_ref, k_ref, v_ref = module_step(weaver, context, kv_ref[0], kv_ref[1], x, depths, ancestors)
        kv_ref[0][:, slots], kv_ref[1][:, slots] = k_ref, v_ref
        expected = weaver.pool_logits(h_ref, CandidatePools(pools.ids[depths], pools.scores[depths]), lm_head)
        torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv_fast, kv_ref, rtol=1e-6, atol=1e-6)


def _ancestors(parents: list[int], slot: int) -> list[int]:
    """Proper ancestors root first."""
    out = []
    while parents[slot] >= 0:
        slot = parents[slot]
        out.append(slot)
    return out[::-1]


def test_step_refuses_several_context_rows(weaver: Weaver) -> None:
    context = weaver.encode_context(torch.randn(2, D_MODEL), torch.randn(2, DEPTH, D_MODEL))
    kv = torch.zeros(LAYERS, 3, HEADS, D_RANK // HEADS)
    with pytest.raises(ValueError, match="context rows must be 1"):
        weaver.step(
            torch.randn(1, D_RANK),
            torch.zeros(1).long(),
            context,
            kv,
            kv,
            torch.zeros(1).long(),
            torch.zeros(1, 1).long(),
        )
