"""The kernel benchmark runs on CPU and writes its table."""

from __future__ import annotations

import csv

import pytest
from weaver_kernels import bench


def test_bench_writes_table(tmp_path, capsys):
    argv = ["--device", "cpu", "--layouts", "small-hybrid", "--n", "16", "--repeats", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "kernel_table.csv").open()))
    assert [(r["layout"], r["n"], r["backend"], r["timing"]) for r in rows] == [("small-hybrid", "16", "ref", "wall")]
    assert float(rows[0]["per_branch_us"]) > 0 and float(rows[0]["fused_us"]) > 0
    assert "small-hybrid" in capsys.readouterr().out


def test_backends_that_resolve_to_the_same_path_are_timed_once(tmp_path):
    """On CPU tensors auto resolves to the reference: asking for auto and ref gives one row per cell, not two."""
    argv = ["--device", "cpu", "--layouts", "small-hybrid", "--n", "16", "17", "--repeats", "1"]
    bench.main([*argv, "--backend", "auto", "ref", "--out", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "kernel_table.csv").open()))
    assert [(r["n"], r["backend"]) for r in rows] == [("16", "ref"), ("17", "ref")]


def test_cuda_timings_are_refused_on_cpu(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--timing", "graph", "--layouts", "small-hybrid", "--n", "16"])
    assert "--timing graph is not available on cpu" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not available on cpu"):
        bench.time_us(lambda: None, bench.torch.device("cpu"), 1, "eager")


def test_a_failing_cell_is_named_and_the_rest_still_written(tmp_path, capsys, monkeypatch):
    real = bench.measure

    class OutOfResources(Exception):  # Triton's compile and resource errors derive from Exception only
        pass

    def measure(layout, n, *args):
        if n == 17:
            raise OutOfResources("out of resource: shared memory")
        return real(layout, n, *args)

    monkeypatch.setattr(bench, "measure", measure)
    argv = ["--device", "cpu", "--layouts", "small-hybrid", "--n", "17", "16", "--repeats", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 1
    assert [r["n"] for r in csv.DictReader((tmp_path / "kernel_table.csv").open())] == ["16"]
    assert "small-hybrid N=17 ref wall: OutOfResources: out of resource" in capsys.readouterr().err


def test_a_backend_that_cannot_run_here_is_refused_up_front(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--backend", "ref", "cuda", "--layouts", "small-hybrid", "--n", "16"])
    assert "backend 'cuda' needs CUDA tensors" in capsys.readouterr().err


def test_tree_attention_layout_times_the_models_masked_sdpa_against_the_kernel(tmp_path, monkeypatch):
    """Its baseline is the target's fallback (SDPA over the dense ancestor mask): the same attention as the kernel's
    reference on the layout's inputs; the layout is opt-in, so the default table keeps its rows."""
    import torch
    import weaver_kernels as wk

    monkeypatch.setitem(bench.TREE_ATTENTION, "tree-attention", (4, 2, 16, 5))  # a small layout: HQ, HKV, D, T
    args = bench.make_attention_inputs(6, torch.device("cpu"), torch.float32, seed=6)
    parents = args[5].tolist()
    mask = torch.ones(6, 11, dtype=torch.bool)
    for i in range(6):
        ancestors = {i}
        while parents[min(ancestors)] >= 0:
            ancestors.add(parents[min(ancestors)])
        mask[i, 5:] = torch.tensor([j in ancestors for j in range(6)])
    sdpa = bench.masked_sdpa(*args[:5], mask)[0].transpose(0, 1)  # [N, HQ, D]
    torch.testing.assert_close(sdpa, wk.tree_attention_ref(*args), rtol=1e-5, atol=1e-5)

    argv = ["--device", "cpu", "--layouts", "tree-attention", "--n", "6", "--repeats", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "kernel_table.csv").open()))
    assert [(r["layout"], r["n"], r["backend"]) for r in rows] == [("tree-attention", "6", "ref")]

    seen = []
    row = bench.Row("x", 16, "cpu", "ref", "float32", "wall", 1.0, 1.0, 1.0)
    monkeypatch.setattr(bench, "measure", lambda layout, *rest: seen.append(layout) or row)
    assert bench.main(["--device", "cpu", "--n", "16"]) == 0
    assert "small-hybrid" in seen and "tree-attention" not in seen


def test_gpu_check_asks_for_layouts_the_bench_knows():
    """kernels/gpu_check.sh runs only on a lent GPU: a misspelt layout there would cost that session its table."""
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "kernels" / "gpu_check.sh").read_text()
    layouts = re.search(r"-m weaver_kernels\.bench .*?--layouts ([\w.\- ]+?) --", script, re.S)
    assert layouts, "gpu_check.sh no longer passes --layouts to weaver_kernels.bench"
    known = {*bench.LAYOUTS, *bench.WEAVER_STEP, *bench.TREE_ATTENTION}
    assert set(layouts[1].split()) <= known and "tree-attention" in layouts[1].split()
