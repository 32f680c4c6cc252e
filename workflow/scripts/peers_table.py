"""Peers on CPU: tokens/s, acceptance length tau and speedup over transformers' AR for every peer, per dataset and
macro averaged, from one run on the same prompts and machine (python -m weaver.peers).

Inputs: results/{run}/raw/peers/{model}/{dataset}.jsonl. Outputs: figures/{run}/peers.{md,tex}.
"""

import sys
from pathlib import Path

import pandas as pd

BASELINE = "transformers_ar"
ORDER = [
    "transformers_ar",
    "transformers_prompt_lookup",
    "dflash_reference",
    "ar",
    "prompt_lookup",
    "chain",
    "ddtree",
    "weaver",
]


def peers_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, peer, dataset) plus a macro row per (model, peer): throughput = sum tokens / sum wall."""
    cells = rows.groupby(["model", "dataset", "peer"], as_index=False).agg(
        new_tokens=("new_tokens", "sum"), wall_s=("wall_s", "sum"), tau=("tau", "mean"), same=("same_output", "all")
    )
    cells["tok/s"] = cells["new_tokens"] / cells["wall_s"]
    base = cells[cells["peer"] == BASELINE].set_index(["model", "dataset"])["tok/s"]
    cells["speedup"] = cells["tok/s"] / base.reindex(pd.MultiIndex.from_frame(cells[["model", "dataset"]])).to_numpy()
    macro = cells.groupby(["model", "peer"], as_index=False)[["tok/s", "tau", "speedup", "same"]].agg(
        {"tok/s": "mean", "tau": "mean", "speedup": "mean", "same": "all"}
    )
    macro["dataset"] = "macro"
    table = pd.concat([cells, macro], ignore_index=True)
    table["order"] = table["peer"].map(ORDER.index)
    table = table.sort_values(["model", "dataset", "order"])
    return table[["model", "dataset", "peer", "tok/s", "tau", "speedup", "same"]].rename(
        columns={"same": "same tokens"}
    )


def main(smk) -> None:
    sys.path.insert(0, smk.scriptdir)
    import plot_style

    rows = pd.concat([pd.read_json(path, lines=True) for path in smk.input.rows], ignore_index=True)
    table = peers_table(rows)
    threads = ", ".join(str(int(t)) for t in sorted(rows["threads"].unique()))
    caption = f"Peers on CPU ({threads} torch threads): speedup over {BASELINE}, same prompts, one run"
    plot_style.save_table(table, [str(Path(p)) for p in smk.output], caption)


if "snakemake" in globals():
    main(snakemake)  # noqa: F821
