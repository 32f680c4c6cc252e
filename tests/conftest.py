"""Shared fixtures: seeded single-threaded runs and tiny random targets of every family (HF twin + ours)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_hf_model


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
