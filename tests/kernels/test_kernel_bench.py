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
