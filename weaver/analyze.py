"""Raw benchmark logs -> tidy CSV tables (METHOD.md section 8).

`python -m weaver.analyze --meta CELL/meta.json ... [--kernels kernel_table.csv] --out DIR` writes
  requests.csv          one row per prompt (tau = new_tokens / steps, step times summed); budget_run is the budget
                        the prompt ran at, which differs from budget only for rows reused by --budget-free;
                        tau_expected is tau with each step's accept length but the last (cut by EOS or
                        max_new_tokens) replaced by its expectation given the step's tree (the engine's
                        expected_accept_lengths): tau with less of the verifier's sampling noise, equal to tau at
                        temperature 0, NaN where the records lack it
  cells.csv             one row per (model, dataset, method, budget, temperature): tau and tau_expected = means
                        over requests, throughput = sum new_tokens / sum wall time (prefill included), speedup
                        over the AR cell
  macro.csv             cells averaged over datasets (macro), the paper's headline numbers; speedup = macro
                        throughput / macro AR throughput, NaN unless every dataset has its AR cell
  depth_acceptance.csv  per draft depth d: steps that reached d and steps that accepted the draft at d
  kernels.csv           GDN kernel bench, long format (layout, n, impl, time_us, speedup over per_branch)
Speedups are always computed from the AR run on the same host in the same logs, never from copied numbers; "host" is
the machine, with the in-process engine's device when that is not the CPU ("vm/cuda:0"), so a GPU cell is compared
with the GPU's AR run only.

--budget-free METHOD: a method whose tree does not depend on the budget once the budget exceeds what it drafts (chain:
the drafter block's B - 1 argmax tokens) is benchmarked at one budget only. Its requests then stand for every larger
budget the other methods of the same model, dataset and temperature ran at, provided no tree of that run reached its
budget (then a larger budget cannot have changed a single step); otherwise the analysis fails and names the cell.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

CELL = ["model", "dataset", "method", "budget", "temperature"]
BASELINE = ["host", "model", "dataset", "temperature"]  # what an AR baseline must share with a method cell
KERNEL_COLUMNS = ("layout", "n", "device", "backend", "dtype", "timing", "per_branch_us", "fused_us")


def load_requests(meta_paths: Sequence[Path]) -> pd.DataFrame:
    """One row per prompt from each finished cell (meta.json + the records.jsonl beside it)."""
    rows = []
    for meta_path in meta_paths:
        meta = json.loads(Path(meta_path).read_text())
        records_path = Path(meta_path).with_name("records.jsonl")
        for line in records_path.read_text().splitlines():
            r = json.loads(line)
            rows.append(
                {
                    **{k: r[k] for k in CELL},
                    "host": _host(meta["hardware"]["host"], r.get("device")),
                    "prompt_id": str(r["prompt_id"]),
                    "prompt_tokens": r["prompt_tokens"],
                    "new_tokens": r["new_tokens"],
                    "steps": r["steps"],
                    "tau": r["new_tokens"] / r["steps"],
                    "tau_expected": _tau_expected(r),
                    "wall_s": r["wall_s"],
                    "ttft_s": r["ttft_s"],
                    "draft_s": sum(r["draft_s"]),
                    "tree_s": sum(r["tree_s"]),
                    "verify_s": sum(r["verify_s"]),
                    "accept_lengths": " ".join(map(str, r["accept_lengths"])),
                    # unknown (not logged, or an HTTP server's None) and no tree at all are NaN: never "fits"
                    "max_tree": max(r["tree_sizes"]) if r.get("tree_sizes") else float("nan"),
                }
            )
    if not rows:
        raise ValueError("no benchmark records found: give --meta paths of finished cells (meta.json)")
    return pd.DataFrame(rows)


def _tau_expected(record: dict) -> float:
    """tau with each step's accept length but the last one replaced by its expectation
    (GenerationStats.tau_expected); NaN for records without expected_accept_lengths (written before they were
    logged, or by an HTTP backend)."""
    expected = record.get("expected_accept_lengths")
    if expected is None:
        return float("nan")
    noise = sum(record["accept_lengths"][:-1]) - sum(expected[:-1])
    return (record["new_tokens"] - noise) / record["steps"]


def _host(machine: str, device: str | None) -> str:
    """Where a record ran: the machine, plus the engine's device unless it is the CPU (records written before the
    device key, and HTTP servers' records, carry none)."""
    return machine if device in (None, "cpu") else f"{machine}/{device}"


def reuse_budget_free(requests: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """Add rows for the budgets a budget-free method was not run at (see the module docstring); budget_run says
    which run a row comes from."""
    requests = requests.assign(budget_run=requests["budget"])
    added = []
    keys = ["host", "model", "dataset", "temperature"]
    budgets_run = requests[requests["method"] != "ar"].groupby(keys)["budget"].agg(set)
    for method in methods:
        for key, group in requests[requests["method"] == method].groupby(keys):
            for budget in sorted(budgets_run[key] - set(group["budget"])):
                below = group[group["budget"] < budget]
                if below.empty:
                    continue
                run = below[below["budget"] == below["budget"].max()]
                if not (run["max_tree"] < run["budget"]).all():  # NaN (no tree sizes logged) fails too
                    raise ValueError(
                        f"{method} at budget {int(run['budget'].iloc[0])} ({', '.join(map(str, key))}) built trees "
                        f"of its full budget, so it cannot stand for budget {budget}: benchmark it at every budget "
                        "(drop it from the grid's budget_free list)"
                    )
                added.append(run.assign(budget=budget))
    return pd.concat([requests, *added], ignore_index=True) if added else requests


def cell_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per cell: tau (mean over requests), throughput and the speedup over AR on the same host."""
    grouped = requests.groupby(["host", *CELL], as_index=False)
    cells = grouped.agg(
        n_requests=("prompt_id", "count"),
        tau=("tau", "mean"),
        tau_expected=("tau_expected", lambda x: x.mean(skipna=False)),  # NaN unless every request has it
        new_tokens=("new_tokens", "sum"),
        wall_s=("wall_s", "sum"),
        draft_s=("draft_s", "sum"),
        tree_s=("tree_s", "sum"),
        verify_s=("verify_s", "sum"),
        budget_run=("budget_run", "max"),
    )
    cells["throughput"] = cells["new_tokens"] / cells["wall_s"]
    ar = cells[cells["method"] == "ar"][[*BASELINE, "throughput"]].rename(columns={"throughput": "ar_throughput"})
    cells = cells.merge(ar, on=BASELINE, how="left")
    cells["speedup"] = cells["throughput"] / cells["ar_throughput"]  # NaN where the grid has no AR cell
    return cells.sort_values(CELL).reset_index(drop=True)


def macro_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells averaged over datasets (macro, METHOD.md section 8); n_datasets says how many went in.

    tau and throughput are means over datasets; the speedup is the macro throughput over the macro AR throughput of
    the same datasets (the paper's headline: 315.0 / 89.9 tok/s = 3.50x), so it is NaN unless every dataset of the
    row has its AR cell, never a mean over the datasets that happen to have one.
    """
    keys = ["host", "model", "method", "budget", "temperature"]
    macro = cells.groupby(keys, as_index=False).agg(
        n_datasets=("dataset", "nunique"),
        tau=("tau", "mean"),
        tau_expected=("tau_expected", lambda x: x.mean(skipna=False)),
        throughput=("throughput", "mean"),
        ar_throughput=("ar_throughput", lambda x: x.mean(skipna=False)),
    )
    macro["speedup"] = macro["throughput"] / macro["ar_throughput"]
    return macro.drop(columns="ar_throughput").sort_values(keys).reset_index(drop=True)


def depth_acceptance(requests: pd.DataFrame) -> pd.DataFrame:
    """Per draft depth d >= 1: steps whose accepted path reached depth d - 1, and those that accepted depth d.

    A step with accept length L (accepted drafts + 1 bonus) accepted the drafts at depths 1..L-1. For a chain
    this is the per-depth acceptance of the drafted token; for a tree, of the best branch the verifier walked.
    """
    rows = []
    for keys, group in requests[requests["method"] != "ar"].groupby(["model", "method", "budget", "temperature"]):
        lengths = [int(x) for s in group["accept_lengths"] for x in s.split()]
        if not lengths:
            continue
        for depth in range(1, max(lengths) + 1):
            reached = sum(1 for length in lengths if length >= depth)
            accepted = sum(1 for length in lengths if length > depth)
            rows.append((*keys, depth, reached, accepted, accepted / reached))
    columns = ["model", "method", "budget", "temperature", "depth", "reached", "accepted", "rate"]
    return pd.DataFrame(rows, columns=columns)


def kernel_table(path: Path) -> pd.DataFrame:
    """The GDN kernel bench (`python -m weaver_kernels.bench` kernel_table.csv: one row per layout, N, backend and
    timing with per_branch_us and fused_us) in long form (n, impl, time_us), with each implementation's speedup over
    per_branch at the same layout, size, backend and timing. The weaver-step rows time another op (reference vs
    dispatched) and are left out."""
    wide = pd.read_csv(path)
    missing = [c for c in KERNEL_COLUMNS if c not in wide.columns]
    if missing:
        raise ValueError(f"{path} lacks columns {missing}: the kernel bench CSV needs {list(KERNEL_COLUMNS)}")
    wide = wide[~wide["layout"].str.startswith("weaver-step")]
    keys = ["layout", "n", "device", "backend", "dtype", "timing"]
    table = wide.melt(id_vars=keys, value_vars=["per_branch_us", "fused_us"], var_name="impl", value_name="time_us")
    table["impl"] = table["impl"].str.removesuffix("_us")
    base = table[table["impl"] == "per_branch"][[*keys, "time_us"]].rename(columns={"time_us": "per_branch_us"})
    table = table.merge(base, on=keys, how="left")
    table["speedup"] = table["per_branch_us"] / table["time_us"]
    return table.drop(columns="per_branch_us").sort_values([*keys, "impl"], ignore_index=True)


def write_csv(table: pd.DataFrame, path: Path) -> None:
    """Atomic CSV write: a reader never sees half a table."""
    tmp = path.with_name(f".{path.name}.tmp")
    table.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m weaver.analyze", description=__doc__.splitlines()[0])
    p.add_argument("--meta", nargs="+", type=Path, required=True, help="meta.json of every finished bench cell")
    p.add_argument("--kernels", type=Path, default=None, help="kernel_table.csv of python -m weaver_kernels.bench")
    p.add_argument("--out", type=Path, required=True, help="folder for the tidy CSV tables")
    p.add_argument(
        "--budget-free",
        nargs="*",
        default=[],
        metavar="METHOD",
        help="methods run at one budget whose requests stand for the larger budgets of the same cells (e.g. chain)",
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    requests = reuse_budget_free(load_requests(args.meta), args.budget_free)
    cells = cell_table(requests)
    write_csv(requests, args.out / "requests.csv")
    write_csv(cells, args.out / "cells.csv")
    write_csv(macro_table(cells), args.out / "macro.csv")
    write_csv(depth_acceptance(requests), args.out / "depth_acceptance.csv")
    kernels = kernel_table(args.kernels) if args.kernels else pd.DataFrame(columns=[*KERNEL_COLUMNS, "speedup"])
    write_csv(kernels, args.out / "kernels.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
