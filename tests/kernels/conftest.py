"""Kernel tests run the Triton kernels on CUDA when a GPU is present, else on CPU tensors under the Triton interpreter.

`nan_poison` makes torch.empty / empty_like return NaN-filled float buffers, so a kernel that leaves part of an output
unwritten (or reads scratch memory it never wrote) fails loudly.
"""

from __future__ import annotations

import os

import pytest
import torch

# TRITON_INTERPRET=1 without a GPU: set by tests/conftest.py before anything imports triton
assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _poisoned(factory):
    def make(*args, **kwargs):
        out = factory(*args, **kwargs)
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    return make


@pytest.fixture
def nan_poison(monkeypatch):
    monkeypatch.setattr(torch, "empty", _poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _poisoned(torch.empty_like))


@pytest.fixture
def device() -> torch.device:
    return DEVICE
