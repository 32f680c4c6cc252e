"""Per-dataset table: acceptance length tau and speedup over AR for each model, method, budget and temperature.

Inputs: results/{run}/tidy/cells.csv. Outputs: figures/{run}/per_dataset.{md,tex}.
"""

import sys

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    cells = pd.read_csv(smk.input.cells)
    cells = cells[cells["method"] != "ar"]
    long = cells.melt(
        id_vars=["model", "method", "budget", "temperature", "dataset"],
        value_vars=["tau", "speedup"],
        var_name="metric",
    )
    wide = long.pivot_table(
        index=["model", "temperature", "method", "budget", "metric"], columns="dataset", values="value"
    ).reset_index()
    wide["method"] = wide["method"].map(plot_style.METHOD_LABELS)
    wide.columns.name = None
    plot_style.save_table(wide, smk.output, "Per-dataset acceptance length tau and speedup over AR")


main(snakemake)  # noqa: F821
