"""Tidy tables from raw benchmark records: speedups from the same logs, budget-free methods reused honestly."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from weaver.analyze import cell_table, depth_acceptance, kernel_table, load_requests, macro_table, reuse_budget_free

MISSING = object()  # a record without the tree_sizes field (older logs)


def write_cell(
    root: Path,
    method: str,
    budget: int,
    accept_lengths: list[int],
    tree_sizes: object,
    dataset: str = "d",
    wall_s: float | None = None,
    device: str | None = None,
    expected: list[list[float]] | None = None,
) -> Path:
    """One finished cell (meta.json + records.jsonl) of two prompts, as weaver.bench writes them (device: the
    engine's, left out as in records written before it was logged; expected: each prompt's expected accept lengths,
    left out as in records written before they were logged)."""
    cell = root / f"{dataset}-{method}-b{budget}{'-' + device if device else ''}"
    cell.mkdir(parents=True)
    records = []
    for i, prompt in enumerate(("p0", "p1")):
        record = {
            "prompt_id": prompt,
            "model": "m",
            "dataset": dataset,
            "method": method,
            "budget": budget,
            "temperature": 0.0,
            "prompt_tokens": 10,
            "new_tokens": sum(accept_lengths) + 1,
            "steps": len(accept_lengths) + 1,
            "accept_lengths": accept_lengths,
            "ttft_s": 0.1,
            "wall_s": wall_s if wall_s is not None else 1.0 + budget / 100,
            "draft_s": [0.01] * len(accept_lengths),
            "tree_s": [0.0] * len(accept_lengths),
            "verify_s": [0.05] * len(accept_lengths),
        }
        if tree_sizes is not MISSING:
            record["tree_sizes"] = tree_sizes
        if device is not None:
            record["device"] = device
        if expected is not None:
            record["expected_accept_lengths"] = expected[i]
        records.append(json.dumps(record))
    (cell / "records.jsonl").write_text("\n".join(records) + "\n")
    (cell / "meta.json").write_text(json.dumps({"hardware": {"host": "h"}}))
    return cell / "meta.json"


@pytest.fixture
def grid(tmp_path: Path) -> list[Path]:
    """ar, ddtree at budgets 16 and 32, chain at 16 only (15-node trees: the budget never bound)."""
    return [
        write_cell(tmp_path, "ar", 0, [1, 1, 1], []),
        write_cell(tmp_path, "ddtree", 16, [3, 2], [16, 16]),
        write_cell(tmp_path, "ddtree", 32, [4, 3], [32, 32]),
        write_cell(tmp_path, "chain", 16, [2, 1, 2], [15, 15, 15]),
    ]


def test_budget_free_method_stands_for_larger_budgets_of_the_same_cells(grid: list[Path]) -> None:
    requests = reuse_budget_free(load_requests(grid), ["chain"])
    chain = cell_table(requests).query("method == 'chain'").set_index("budget")
    assert list(chain.index) == [16, 32]
    assert list(chain["budget_run"]) == [16, 16]
    assert chain.loc[32, "tau"] == chain.loc[16, "tau"] and chain.loc[32, "speedup"] == chain.loc[16, "speedup"]
    ddtree = cell_table(requests).query("method == 'ddtree'")
    assert list(ddtree["budget_run"]) == [16, 32]  # methods run at every budget keep their own runs
    depth = depth_acceptance(requests).query("method == 'chain'")
    assert set(depth["budget"]) == {16, 32}


def test_without_the_flag_nothing_is_reused(grid: list[Path]) -> None:
    cells = cell_table(reuse_budget_free(load_requests(grid), []))
    assert list(cells.query("method == 'chain'")["budget"]) == [16]


@pytest.mark.parametrize(
    "sizes",
    [[15, 16, 15], MISSING, None, []],
    ids=["tree-reached-budget", "no-tree-sizes-logged", "unknown-over-http", "no-trees"],
)
def test_reuse_refused_when_the_budget_may_have_bound(tmp_path: Path, sizes: object) -> None:
    metas = [
        write_cell(tmp_path, "ddtree", 32, [4, 3], [32, 32]),
        write_cell(tmp_path, "chain", 16, [2, 1, 2], sizes),
    ]
    with pytest.raises(ValueError, match="chain at budget 16 .*cannot stand for budget 32"):
        reuse_budget_free(load_requests(metas), ["chain"])


def test_requests_table_marks_reused_rows(grid: list[Path]) -> None:
    requests = reuse_budget_free(load_requests(grid), ["chain"])
    reused = requests[requests["budget"] != requests["budget_run"]]
    assert set(reused["method"]) == {"chain"} and len(reused) == 2


def test_macro_speedup_is_macro_throughput_over_macro_ar(tmp_path: Path) -> None:
    """Two datasets: the speedup is mean throughput / mean AR throughput, not the mean of per-dataset ratios."""
    ar_tokens, tree_tokens = 7, 10  # per prompt: sum of accept lengths + 1
    metas = [
        write_cell(tmp_path, "ar", 0, [1] * 6, [], dataset="a", wall_s=1.0),
        write_cell(tmp_path, "ar", 0, [1] * 6, [], dataset="b", wall_s=4.0),
        write_cell(tmp_path, "ddtree", 16, [3, 2, 1, 1, 1, 1], [16] * 6, dataset="a", wall_s=0.5),
        write_cell(tmp_path, "ddtree", 16, [3, 2, 1, 1, 1, 1], [16] * 6, dataset="b", wall_s=1.0),
    ]
    macro = macro_table(cell_table(reuse_budget_free(load_requests(metas), []))).set_index("method")
    ar = {"a": ar_tokens / 1.0, "b": ar_tokens / 4.0}
    tree = {"a": tree_tokens / 0.5, "b": tree_tokens / 1.0}
    macro_ar, macro_tree = (ar["a"] + ar["b"]) / 2, (tree["a"] + tree["b"]) / 2
    assert macro.loc["ddtree", "speedup"] == pytest.approx(macro_tree / macro_ar)
    mean_of_ratios = (tree["a"] / ar["a"] + tree["b"] / ar["b"]) / 2
    assert macro.loc["ddtree", "speedup"] != pytest.approx(mean_of_ratios)


def test_tau_expected_replaces_each_step_by_its_expectation(tmp_path: Path) -> None:
    """tau_expected = (new_tokens - sum over all steps but the last of (accept - expected)) / steps per request; NaN
    for a cell whose records lack the expectations, so its mean never mixes the two estimates."""
    metas = [
        write_cell(tmp_path, "weaver", 16, [3, 1, 2], [16] * 3, expected=[[2.5, 1.5, 2.0], [2.0, 1.5, 1.25]]),
        write_cell(tmp_path, "ddtree", 16, [2, 2, 1], [16] * 3),
    ]
    requests = load_requests(metas).set_index(["method", "prompt_id"])
    assert requests.loc[("weaver", "p0"), "tau"] == 7 / 4
    assert requests.loc[("weaver", "p0"), "tau_expected"] == pytest.approx(7 / 4)
    assert requests.loc[("weaver", "p1"), "tau_expected"] == pytest.approx((7 - 4 + 3.5) / 4)  # last: realized
    assert requests.loc[("ddtree", "p0"), "tau_expected"] != requests.loc[("ddtree", "p0"), "tau_expected"]  # NaN
    cells = cell_table(reuse_budget_free(load_requests(metas), [])).set_index("method")
    assert cells.loc["weaver", "tau_expected"] == pytest.approx((7 / 4 + 6.5 / 4) / 2)
    assert pd.isna(cells.loc["ddtree", "tau_expected"])
    assert pd.isna(macro_table(cells.reset_index()).set_index("method").loc["ddtree", "tau_expected"])


def test_macro_speedup_needs_ar_on_every_dataset(tmp_path: Path) -> None:
    metas = [
        write_cell(tmp_path, "ar", 0, [1] * 6, [], dataset="a"),
        write_cell(tmp_path, "ddtree", 16, [3, 2], [16, 16], dataset="a"),
        write_cell(tmp_path, "ddtree", 16, [3, 2], [16, 16], dataset="b"),  # no AR cell for b
    ]
    macro = macro_table(cell_table(reuse_budget_free(load_requests(metas), []))).set_index("method")
    assert macro.loc["ddtree", "n_datasets"] == 2 and pd.isna(macro.loc["ddtree", "speedup"])


def test_kernel_speedup_compares_within_one_backend_and_timing(tmp_path: Path) -> None:
    """A GPU table has a row per backend and timing: each fused time is divided into the per-branch time of its own
    backend and timing, never another's; weaver-step rows (another op) are left out."""
    head = "layout,n,device,backend,dtype,timing,per_branch_us,fused_us,speedup\n"
    rows = [
        "big,128,cuda,triton,bfloat16,graph,400.0,50.0,8.0",
        "big,128,cuda,triton,bfloat16,eager,500.0,100.0,5.0",
        "big,128,cuda,cuda,bfloat16,graph,410.0,41.0,10.0",
        "weaver-step,128,cuda,triton,bfloat16,graph,90.0,30.0,3.0",
    ]
    (tmp_path / "k.csv").write_text(head + "\n".join(rows) + "\n")
    table = kernel_table(tmp_path / "k.csv")
    fused = table[table["impl"] == "fused"].set_index(["backend", "timing"])["speedup"]
    assert fused.to_dict() == {("cuda", "graph"): 10.0, ("triton", "eager"): 5.0, ("triton", "graph"): 8.0}
    assert set(table["layout"]) == {"big"}
    assert (table[table["impl"] == "per_branch"]["speedup"] == 1.0).all()


def test_kernel_table_without_timing_column_is_refused(tmp_path: Path) -> None:
    (tmp_path / "k.csv").write_text("layout,n,device,backend,dtype,per_branch_us,fused_us\nx,16,cpu,ref,float32,2,1\n")
    with pytest.raises(ValueError, match="timing"):
        kernel_table(tmp_path / "k.csv")


def test_gpu_cells_are_compared_with_the_gpu_ar_run(tmp_path: Path) -> None:
    """CPU and CUDA runs on one machine are separate hosts: a GPU method's speedup uses the GPU's AR throughput."""
    metas = [
        write_cell(tmp_path, "ar", 0, [1] * 6, [], wall_s=1.0),  # a record from before the device key: the CPU
        write_cell(tmp_path, "ar", 0, [1] * 6, [], wall_s=0.1, device="cuda:0"),
        write_cell(tmp_path, "ddtree", 16, [1] * 6, [16] * 6, wall_s=0.05, device="cuda:0"),
    ]
    cells = cell_table(reuse_budget_free(load_requests(metas), [])).set_index(["host", "method"])
    assert set(cells.index) == {("h", "ar"), ("h/cuda:0", "ar"), ("h/cuda:0", "ddtree")}
    assert cells.loc[("h/cuda:0", "ddtree"), "speedup"] == pytest.approx(2.0)
