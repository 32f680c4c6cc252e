"""The one dispatch point: backend choice, forcing, clear errors, batch handling of the public ops."""

from __future__ import annotations

import pytest
import torch
import weaver_kernels as wk
from kernel_inputs import assert_close, gdn_inputs, make_parents
from weaver_kernels import dispatch


def test_auto_on_cpu_is_ref_and_env_var_is_read(monkeypatch):
    monkeypatch.delenv("WEAVER_KERNELS", raising=False)
    assert wk.resolve("gdn_tree_verify", torch.device("cpu")) == "ref"
    monkeypatch.setenv("WEAVER_KERNELS", "triton")
    assert dispatch.requested_backend() == "triton"
    with wk.use_backend("ref"):
        assert wk.resolve("gdn_tree_verify", torch.device("cpu")) == "ref"
    monkeypatch.setenv("WEAVER_KERNELS", "fast")
    with pytest.raises(ValueError, match="choose from"):
        wk.resolve("gdn_tree_verify", torch.device("cpu"))


def test_forced_cuda_on_cpu_and_triton_without_interpreter_fail_clearly(monkeypatch):
    with wk.use_backend("cuda"), pytest.raises(RuntimeError, match="needs CUDA tensors"):
        wk.resolve("gdn_tree_verify", torch.device("cpu"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with wk.use_backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        wk.resolve("tree_attention", torch.device("cpu"))


def test_every_op_has_ref_and_triton():
    for op, impls in dispatch.IMPLS.items():
        assert {"ref", "triton"} <= impls.keys(), op
        assert callable(getattr(wk, op)) and callable(getattr(wk, f"{op}_ref")), op


def test_public_ops_add_and_strip_the_batch_dim_around_the_fast_path():
    """Auto on CPU tensors is the reference itself; the forced Triton path (interpreted) gets single-sequence calls
    with a batch dim added and removed, batched calls as they are, and agrees with the reference both ways."""
    gen = torch.Generator().manual_seed(0)
    parents = make_parents("random", 9, gen)
    x = gdn_inputs(9, 1, 3, 8, 8, torch.float32, gen)
    qkvgb = [x[n] for n in ("q", "k", "v", "g", "beta")]
    ref = wk.gdn_tree_verify_ref(*qkvgb, parents, x["initial_state"])
    assert_close(wk.gdn_tree_verify(*qkvgb, parents, x["initial_state"]), ref, 0)  # auto on CPU: the reference
    ref_commit = wk.gdn_tree_commit_ref(*qkvgb[1:], parents, x["initial_state"], 3)
    xb = {n: t[None].expand(2, *t.shape).contiguous() for n, t in x.items()}
    with wk.use_backend("triton"):
        assert wk.resolve("gdn_tree_verify", torch.device("cpu")) == "triton"
        assert_close(wk.gdn_tree_verify(*qkvgb, parents, x["initial_state"]), ref, 1e-5, "single verify")
        single = wk.gdn_tree_commit(*qkvgb[1:], parents, x["initial_state"], 3)
        batched = wk.gdn_tree_commit(
            xb["k"], xb["v"], xb["g"], xb["beta"], parents, xb["initial_state"], torch.tensor([3, 5])
        )
    assert_close(single, ref_commit, 1e-5, "single commit")
    assert batched.shape == (2, 3, 8, 8)
    assert_close(batched[0], ref_commit, 1e-5, "batched commit, row 0")
    ref_commit5 = wk.gdn_tree_commit_ref(*qkvgb[1:], parents, x["initial_state"], 5)
    assert_close(batched[1], ref_commit5, 1e-5, "batched commit, row 1")
