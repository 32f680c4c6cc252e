"""GDN tree references (weaver_kernels.gdn_tree.naive) against a sequential recurrence run separately along every
root-to-node path (METHOD.md sections 7 and 9)."""

from __future__ import annotations

import pytest
import torch
import weaver_kernels as wk
from kernel_inputs import SHAPES, assert_close, gdn_inputs, make_parents, path_of
from weaver_kernels.gdn_tree import ancestor_masks, tree_path_cumsum

TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def sequential(q, k, v, g, beta, s0):
    """Plain per-token gated delta rule along one path: S_t = e^g_t (I - b_t k_t k_t^T) S + b_t k_t v_t^T.

    q, k [T, H, K]; v [T, HV, V]; g, beta [T, HV]; s0 [HV, K, V] -> (o [T, HV, V], S [HV, K, V]), in fp64.
    """
    hv, dk = v.shape[1], k.shape[2]
    rep = hv // k.shape[1]
    s = s0.double().clone()
    outs = []
    for t in range(q.shape[0]):
        o_t = []
        for h in range(hv):
            kt, qt = k[t, h // rep].double(), q[t, h // rep].double()
            decay = torch.eye(dk, dtype=torch.float64) - beta[t, h].double() * torch.outer(kt, kt)
            s[h] = g[t, h].double().exp() * decay @ s[h] + beta[t, h].double() * torch.outer(kt, v[t, h].double())
            o_t.append(s[h].T @ qt)
        outs.append(torch.stack(o_t))
    return torch.stack(outs), s


def along_path(x, path):
    return {name: (t if name == "initial_state" else t[path]) for name, t in x.items()}


def seq_on(x, path):
    p = along_path(x, path)
    return sequential(p["q"], p["k"], p["v"], p["g"], p["beta"], p["initial_state"])


CASES = [
    pytest.param(shape, n, rep, id=f"{shape}-N{n}-gqa{rep}")
    for shape, n in [("chain", 9), ("star", 9), ("depth1", 2), ("binary", 15), ("random", 17), ("random", 1)]
    for rep in (1, 3)
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("shape,n,rep", CASES)
def test_verify_commit_per_branch_match_every_path(shape, n, rep, dtype):
    gen = torch.Generator().manual_seed(n * 7 + rep)
    parents = make_parents(shape, n, gen)
    n = parents.numel()
    x = gdn_inputs(n, 2, 2 * rep, 8, 6, dtype, gen)
    o = wk.gdn_tree_verify_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"])
    o_pb, states = wk.gdn_tree_verify_per_branch_ref(
        x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"]
    )
    assert o.dtype == dtype and states.shape == (n, 2 * rep, 8, 6)
    for node in range(n):
        o_seq, s_seq = seq_on(x, path_of(parents, node))
        assert_close(o[node], o_seq[-1], TOL[dtype], f"verify node {node}")
        assert_close(o_pb[node], o_seq[-1], TOL[dtype], f"per-branch node {node}")
        assert_close(states[node], s_seq, TOL[dtype], f"per-branch state {node}")
        commit = wk.gdn_tree_commit_ref(x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"], node)
        assert_close(commit, s_seq, TOL[dtype], f"commit leaf {node}")


def test_chain_equals_recurrent_ref():
    gen = torch.Generator().manual_seed(0)
    x = gdn_inputs(13, 2, 6, 8, 6, torch.float64, gen)
    o_rec, s_rec = wk.gdn_recurrent_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"])
    o_seq, s_seq = sequential(*x.values())
    assert_close(o_rec, o_seq, 1e-12, "recurrent outputs")
    assert_close(s_rec, s_seq, 1e-12, "recurrent state")


@pytest.mark.parametrize("shape", SHAPES)
def test_masks_and_path_cumsum(shape):
    gen = torch.Generator().manual_seed(1)
    parents = make_parents(shape, 23, gen)
    n = parents.numel()
    anc, anc_self = ancestor_masks(parents)
    g = torch.randn(n, 3, dtype=torch.float64, generator=gen)
    G = tree_path_cumsum(g, parents)
    for i in range(n):
        path = path_of(parents, i)
        assert anc_self[i].nonzero().flatten().tolist() == path
        assert anc[i].nonzero().flatten().tolist() == path[:-1]
        assert_close(G[i], g[path].sum(0), 1e-12, f"G node {i}")


def test_batch_dim_matches_per_sequence():
    gen = torch.Generator().manual_seed(2)
    parents = torch.stack([make_parents("random", 11, gen), make_parents("binary", 11, gen)])
    xs = [gdn_inputs(11, 1, 3, 8, 6, torch.float64, gen) for _ in range(2)]
    xb = {name: torch.stack([x[name] for x in xs]) for name in xs[0]}
    args = lambda x: (x["k"], x["v"], x["g"], x["beta"])  # noqa: E731
    o = wk.gdn_tree_verify_ref(xb["q"], *args(xb), parents, xb["initial_state"])
    o_pb, st = wk.gdn_tree_verify_per_branch_ref(xb["q"], *args(xb), parents, xb["initial_state"])
    leaf = torch.tensor([7, 0])
    commit = wk.gdn_tree_commit_ref(*args(xb), parents, xb["initial_state"], leaf)
    shared = wk.gdn_tree_verify_ref(xb["q"], *args(xb), parents[0], xb["initial_state"])
    for b, x in enumerate(xs):
        assert_close(o[b], wk.gdn_tree_verify_ref(x["q"], *args(x), parents[b], x["initial_state"]), 1e-12)
        assert_close(o_pb[b], o[b], 1e-10)
        st_b = wk.gdn_tree_verify_per_branch_ref(x["q"], *args(x), parents[b], x["initial_state"])[1]
        assert_close(st[b], st_b, 1e-12)
        assert_close(commit[b], seq_on(x, path_of(parents[b], int(leaf[b])))[1], 1e-10)
        assert_close(shared[b], wk.gdn_tree_verify_ref(x["q"], *args(x), parents[0], x["initial_state"]), 1e-12)


def conv_on_path(x, weight, conv_state, path):
    """Sequential causal depthwise conv (no bias, no activation) of the last token of conv_state ++ x[path].

    Returns (pre-activation [C], the new committed window [C, W-1]), in fp64.
    """
    seq = torch.cat([conv_state, x[path].T], dim=1).double()
    y = (seq[:, -weight.shape[1] :] * weight.double()).sum(1)
    return y, seq[:, seq.shape[1] - conv_state.shape[1] :]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("shape,n", [("chain", 7), ("star", 5), ("depth1", 2), ("binary", 13), ("random", 19)])
def test_conv1d_and_conv_commit_follow_each_path(shape, n, dtype):
    gen = torch.Generator().manual_seed(n)
    parents = make_parents(shape, n, gen)
    n, c, w = parents.numel(), 5, 4
    x, weight, bias, state = (torch.randn(*s, generator=gen).to(dtype) for s in [(n, c), (c, w), (c,), (c, w - 1)])
    y = wk.gdn_tree_conv1d_ref(x, weight, bias, parents, state)
    y_lin = wk.gdn_tree_conv1d_ref(x, weight, None, parents, state, None)
    for node in range(n):
        pre, window = conv_on_path(x, weight, state, path_of(parents, node))
        assert_close(y[node], torch.nn.functional.silu(pre + bias.double()), TOL[dtype], f"conv node {node}")
        assert_close(y_lin[node], pre, TOL[dtype], f"linear conv node {node}")
        assert_close(wk.gdn_tree_conv_commit_ref(x, parents, state, node), window.to(dtype), TOL[dtype], "window")


def test_conv_batch_dim_and_bad_activation():
    gen = torch.Generator().manual_seed(3)
    parents = torch.stack([make_parents("random", 9, gen), make_parents("chain", 9, gen)])
    x, weight, state = torch.randn(2, 9, 5, generator=gen), torch.randn(5, 4, generator=gen), torch.randn(2, 5, 3)
    y = wk.gdn_tree_conv1d_ref(x, weight, None, parents, state)
    for b in range(2):
        assert_close(y[b], wk.gdn_tree_conv1d_ref(x[b], weight, None, parents[b], state[b]), 1e-6)
    with pytest.raises(ValueError, match="activation"):
        wk.gdn_tree_conv1d_ref(x[0], weight, None, parents[0], state[0], "relu")
