"""Every Triton kernel against its PyTorch reference (fp32; under TRITON_INTERPRET=1 on CPU, natively on a GPU), with
NaN-poisoned buffers, odd sizes N = 1, 17, 63, 129, GQA ratios 1 and 3 and the tree shapes of METHOD.md section 9."""

from __future__ import annotations

import pytest
import torch
import weaver_kernels as wk
from kernel_inputs import assert_close, gdn_inputs, make_parents, path_of

pytestmark = pytest.mark.usefixtures("nan_poison")

K = V = 16
TOL = 1e-4


def inputs(shape, n, rep, device, batch=1, seed=0):
    """Batched GDN inputs [B, ...] and parents [B, N] on device."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.stack([make_parents(shape, n, gen) for _ in range(batch)])
    xs = [gdn_inputs(parents.shape[1], 1, rep, K, V, torch.float32, gen) for _ in range(batch)]
    x = {name: torch.stack([d[name] for d in xs]).to(device) for name in xs[0]}
    return x, parents.to(device)


def both(op, *args):
    """(fast path, reference) of one public op on the same args."""
    with wk.use_backend("triton"):
        fast = getattr(wk, op)(*args)
    with wk.use_backend("ref"):
        ref = getattr(wk, op)(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
    return fast, ref


VERIFY_CASES = [
    pytest.param("random", 129, 3, id="random-N129-gqa3"),
    pytest.param("chain", 63, 1, id="chain-N63-gqa1"),
    pytest.param("binary", 63, 3, id="binary-N63-gqa3"),
    pytest.param("star", 17, 3, id="star-N17-gqa3"),
    pytest.param("random", 17, 1, id="random-N17-gqa1"),
    pytest.param("depth1", 2, 3, id="depth1-N2-gqa3"),
    pytest.param("random", 1, 1, id="single-N1-gqa1"),
]


@pytest.mark.parametrize("shape,n,rep", VERIFY_CASES)
def test_fused_verify_matches_ref(shape, n, rep, device):
    x, parents = inputs(shape, n, rep, device)
    fast, ref = both("gdn_tree_verify", x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"])
    assert_close(fast.cpu(), ref, TOL, "tree verify")


@pytest.mark.parametrize("dk,dv", [(8, 16), (4, 40)], ids=["k8", "k4-v40"])
def test_fused_verify_pads_small_head_dims(dk, dv, device):
    """Key dims below 16 (tl.dot's smallest inner dim on GPUs; tiny Qwen3.5 configs use 8) run padded with masked
    loads; odd value dims are masked too."""
    gen = torch.Generator().manual_seed(2)
    parents = make_parents("random", 37, gen)
    x = gdn_inputs(37, 2, 4, dk, dv, torch.float32, gen)
    args = [x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"]]
    fast, ref = both("gdn_tree_verify", *(a.to(device) for a in args))
    assert_close(fast.cpu(), ref, TOL, f"tree verify K={dk} V={dv}")


def test_fused_verify_chain_is_sequential_rule(device):
    x, parents = inputs("chain", 40, 3, device)
    with wk.use_backend("triton"):
        o = wk.gdn_tree_verify(
            x["q"][0], x["k"][0], x["v"][0], x["g"][0], x["beta"][0], parents[0], x["initial_state"][0]
        )
    o_seq, _ = wk.gdn_recurrent_ref(*(t[0].cpu() for t in x.values()))
    assert_close(o.cpu(), o_seq, TOL, "chain verify")


@pytest.mark.parametrize("shape,n,rep", [("random", 17, 3), ("chain", 63, 1), ("binary", 1, 3)], ids=str)
def test_per_branch_matches_ref(shape, n, rep, device):
    x, parents = inputs(shape, n, rep, device, seed=n)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"])
    (o, states), (o_ref, states_ref) = both("gdn_tree_verify_per_branch", *args)
    assert_close(o.cpu(), o_ref, TOL, "per-branch outputs")
    assert_close(states.cpu(), states_ref, TOL, "per-branch states")


@pytest.mark.parametrize("shape,n,rep", [("random", 129, 3), ("binary", 17, 1), ("chain", 1, 3)], ids=str)
def test_commit_matches_sequential_replay(shape, n, rep, device):
    x, parents = inputs(shape, n, rep, device, batch=2, seed=n + 1)
    n = parents.shape[1]
    for leaf in sorted({0, n // 2, n - 1}):
        leaves = torch.tensor([leaf, n - 1 - leaf], device=device)
        fast, ref = both("gdn_tree_commit", x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"], leaves)
        assert_close(fast.cpu(), ref, TOL, f"commit leaf {leaf}")
        path = path_of(parents[0].cpu(), leaf)
        replay = wk.gdn_recurrent_ref(
            *(t[0, path].cpu() for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])), x["initial_state"][0].cpu()
        )[1]
        assert_close(fast[0].cpu(), replay, TOL, "commit vs replay")


@pytest.mark.parametrize("shape,n", [("random", 129), ("chain", 17), ("star", 63), ("depth1", 2)], ids=str)
@pytest.mark.parametrize("bias,activation", [(True, "silu"), (False, None)], ids=["bias-silu", "linear"])
def test_conv1d_matches_ref(shape, n, bias, activation, device):
    gen = torch.Generator().manual_seed(n)
    parents = make_parents(shape, n, gen).to(device)
    n, c, w = parents.numel(), 40, 4
    x, weight, b, state = (torch.randn(*s, generator=gen).to(device) for s in [(n, c), (c, w), (c,), (c, w - 1)])
    fast, ref = both("gdn_tree_conv1d", x, weight, b if bias else None, parents, state, activation)
    assert_close(fast.cpu(), ref, TOL, "tree conv")


@pytest.mark.parametrize("shape,n,t,rep", [("random", 129, 45, 3), ("binary", 17, 0, 1), ("chain", 1, 7, 3)], ids=str)
def test_tree_attention_matches_ref(shape, n, t, rep, device):
    gen = torch.Generator().manual_seed(n + t)
    parents = make_parents(shape, n, gen).to(device)
    n = parents.numel()
    q, k, v = (torch.randn(n, h, 16, generator=gen).to(device) for h in (2 * rep, 2, 2))
    kp, vp = (torch.randn(t, 2, 16, generator=gen).to(device) for _ in range(2))
    fast, ref = both("tree_attention", q, k, v, kp, vp, parents)
    assert_close(fast.cpu(), ref, TOL, "tree attention")


def test_batch_and_shared_parents(device):
    x, parents = inputs("random", 33, 3, device, batch=2, seed=5)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    for par in (parents, parents[1]):
        fast, ref = both("gdn_tree_verify", *args, par, x["initial_state"])
        assert_close(fast.cpu(), ref, TOL, "batched verify")
