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


def test_public_ops_on_cpu_equal_refs_single_and_batched():
    gen = torch.Generator().manual_seed(0)
    parents = make_parents("random", 9, gen)
    x = gdn_inputs(9, 1, 3, 8, 8, torch.float32, gen)
    single = wk.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"])
    assert_close(
        single, wk.gdn_tree_verify_ref(*(x[n] for n in ("q", "k", "v", "g", "beta")), parents, x["initial_state"]), 0
    )
    xb = {n: t[None].expand(2, *t.shape) for n, t in x.items()}
    batched = wk.gdn_tree_commit(
        xb["k"], xb["v"], xb["g"], xb["beta"], parents, xb["initial_state"], torch.tensor([3, 3])
    )
    assert batched.shape == (2, 3, 8, 8)
    assert_close(batched[1], wk.gdn_tree_commit(x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"], 3), 0)
