"""The kernel benchmark runs on CPU and writes its table."""

from __future__ import annotations

import csv

from weaver_kernels import bench


def test_bench_writes_table(tmp_path, capsys):
    bench.main(["--device", "cpu", "--layouts", "small-hybrid", "--n", "16", "--repeats", "1", "--out", str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / "kernel_table.csv").open()))
    assert [(r["layout"], r["n"], r["backend"]) for r in rows] == [("small-hybrid", "16", "ref")]
    assert float(rows[0]["per_branch_us"]) > 0 and float(rows[0]["fused_us"]) > 0
    assert "small-hybrid" in capsys.readouterr().out
