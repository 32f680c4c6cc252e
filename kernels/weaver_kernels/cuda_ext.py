"""The CUDA C++ extension (kernels/csrc), built by `python -m weaver_kernels.build` and loaded from its build folder."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = (CSRC / "gdn_tree_verify.cu",)
BUILD_DIR = Path(__file__).resolve().parent / "_build"
NAME = "weaver_gdn_cuda"
NVCC_FLAGS = ("-O3", "-std=c++20", "--use_fast_math")


def unavailable_reason() -> str | None:
    """Why the extension cannot be built here, or None when it can."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (no CUDA toolkit support in torch.utils.cpp_extension)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    return None


@functools.cache
def load(verbose: bool = False):
    """Compile (first time; cached in BUILD_DIR) and import the extension module (once per process)."""
    from torch.utils.cpp_extension import load as load_extension

    BUILD_DIR.mkdir(exist_ok=True)
    return load_extension(
        name=NAME,
        sources=[str(s) for s in SOURCES],
        build_directory=str(BUILD_DIR),
        extra_cuda_cflags=list(NVCC_FLAGS),
        verbose=verbose,
    )


@functools.cache
def available() -> bool:
    """True when the extension was built by `python -m weaver_kernels.build` and loads."""
    if unavailable_reason() is not None or not any(BUILD_DIR.glob(f"{NAME}*.so")):
        return False
    load()
    return True


def gdn_tree_verify_cuda(q, k, v, g, beta, parents, initial_state) -> torch.Tensor:
    """CUDA twin of gdn_tree_verify_triton: q, k [B, N, H, K], v [B, N, HV, V], g, beta [B, N, HV], parents [B, N],
    initial_state [B, HV, K, V] (all one dtype) -> o [B, N, HV, V]. Launched on torch's current stream of v's device
    (so it can be captured in a CUDA graph)."""
    dtype = v.dtype
    args = [x.to(dtype) for x in (q, k, v, g, beta)] + [parents.long(), initial_state.to(dtype)]
    with torch.cuda.device(v.device):
        return load().gdn_tree_verify(*args, torch.cuda.current_stream().cuda_stream)
