"""The CUDA C++ source compiles wherever nvcc exists (compile only: torch here may be a CPU build), and the build
command reports clearly what it skipped and why."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch
from weaver_kernels import build, cuda_ext


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found on PATH: the CUDA source was not compiled")
def test_cuda_source_compiles_with_nvcc(tmp_path: Path):
    torch_inc = Path(torch.__file__).parent / "include"
    cmd = [
        "nvcc", "-c", *cuda_ext.NVCC_FLAGS, "-Xcompiler", "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
        f"-DTORCH_EXTENSION_NAME={cuda_ext.NAME}", f"-I{torch_inc}", f"-I{torch_inc / 'torch/csrc/api/include'}",
        f"-I{sysconfig.get_paths()['include']}", str(cuda_ext.SOURCES[0]), "-o", str(tmp_path / "gdn_tree_verify.o"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "gdn_tree_verify.o").stat().st_size > 0


def test_build_reports_skip_reason(capsys):
    reason = cuda_ext.unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is available here: the build itself runs in kernels/gpu_check.sh")
    assert build.main([]) == 0
    assert build.main(["--require"]) == 1
    out = capsys.readouterr().out
    assert "SKIPPED" in out and reason in out


needs_extension = pytest.mark.skipif(
    not cuda_ext.available(), reason="CUDA extension not built (python -m weaver_kernels.build)"
)


@needs_extension
@pytest.mark.parametrize(
    ("h", "hv", "dk", "dv"),
    [(2, 2, 32, 32), (2, 6, 32, 32), (1, 3, 128, 128), (2, 2, 64, 160), (1, 1, 200, 16)],
    ids=["k32", "gqa3", "k128", "v160-two-column-blocks", "k200"],
)
def test_cuda_verify_matches_ref(h, hv, dk, dv):
    """Every register tile (K <= 32 / 64 / 128 / 256), GQA, value dims split over column blocks, trees of 1 to 129
    nodes, one sequence and a batch of two different trees."""
    import weaver_kernels as wk
    from kernel_inputs import assert_close, gdn_inputs, make_parents

    gen = torch.Generator().manual_seed(0)
    for shape, n in [("random", 129), ("chain", 17), ("star", 1), ("binary", 63)]:
        parents = make_parents(shape, n, gen)
        x = gdn_inputs(parents.numel(), h, hv, dk, dv, torch.float32, gen)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"], parents, x["initial_state"])
        with wk.use_backend("cuda"):
            fast = wk.gdn_tree_verify(*(a.cuda() for a in args))
        assert_close(fast.cpu(), wk.gdn_tree_verify_ref(*args), 1e-4, f"cuda verify {shape}")
    trees = [make_parents("random", 40, gen), make_parents("binary", 40, gen)]
    xs = [gdn_inputs(40, h, hv, dk, dv, torch.float32, gen) for _ in trees]
    names = ("q", "k", "v", "g", "beta")
    batch = [torch.stack([x[name] for x in xs]) for name in names]
    batch += [torch.stack(trees), torch.stack([x["initial_state"] for x in xs])]
    with wk.use_backend("cuda"):
        fast = wk.gdn_tree_verify(*(a.cuda() for a in batch)).cpu()
    for b, (x, parents) in enumerate(zip(xs, trees, strict=True)):
        ref = wk.gdn_tree_verify_ref(*(x[name] for name in names), parents, x["initial_state"])
        assert_close(fast[b], ref, 1e-4, f"cuda verify batch row {b}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CUDA graphs need one")
@pytest.mark.parametrize("backend", [pytest.param("cuda", marks=needs_extension), "triton"])
def test_verify_replays_in_a_cuda_graph(backend):
    """The fast paths launch on torch's current stream: captured in a CUDA graph, a replay on new inputs (copied into
    the captured tensors) gives the reference's output for those inputs (a launch on another stream would leave the
    graph empty and the output stale)."""
    import weaver_kernels as wk
    from kernel_inputs import assert_close, gdn_inputs, make_parents

    gen = torch.Generator().manual_seed(1)
    parents = make_parents("random", 33, gen).cuda()
    first, second = (gdn_inputs(33, 2, 4, 64, 64, torch.float32, gen) for _ in range(2))
    names = ("q", "k", "v", "g", "beta")
    static = {name: first[name].cuda() for name in (*names, "initial_state")}

    def verify():
        return wk.gdn_tree_verify(*(static[name] for name in names), parents, static["initial_state"])

    with wk.use_backend(backend):
        verify()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = verify()
    for name, x in static.items():
        x.copy_(second[name])
    graph.replay()
    torch.cuda.synchronize()
    ref = wk.gdn_tree_verify_ref(*(second[name] for name in names), parents.cpu(), second["initial_state"])
    assert_close(out.cpu(), ref, 1e-4, f"{backend} verify replayed from a CUDA graph")
