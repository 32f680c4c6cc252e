"""Shared fixtures: seeded single-threaded runs and tiny random targets of every family (HF twin + ours).

Without a GPU, Triton kernels run under its interpreter in every test that forces them (tests/kernels, and the
target's verify through the kernels in tests/test_model_tree.py): TRITON_INTERPRET must be set before anything
imports triton, since @triton.jit picks the interpreter when it decorates.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # importing torch does not import triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from tiny_models import tiny_hf_model  # noqa: E402


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test starts from seed 0 on one thread (the machine's cores are shared)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)


@pytest.fixture
def tiny_pair():
    """Factory: family -> (transformers model, our Transformer) with the same weights."""
    from weaver.models import from_hf_model

    def make(family: str, **overrides):
        hf = tiny_hf_model(family, **overrides)
        return hf, from_hf_model(hf)

    return make
