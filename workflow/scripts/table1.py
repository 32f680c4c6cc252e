"""Table 1: throughput (tok/s), speedup over autoregressive decoding and acceptance length tau per method, macro
averaged over datasets, at the headline budget and temperature of the config (METHOD.md section 8).

Inputs: results/{run}/tidy/macro.csv. Outputs: figures/{run}/table1.{md,tex}.
"""

import sys

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    macro = pd.read_csv(smk.input.macro)
    at = macro[((macro["budget"] == smk.params.budget) | (macro["method"] == "ar"))]
    at = at[at["temperature"] == smk.params.temperature]
    at = at.assign(order=at["method"].map(plot_style.METHOD_ORDER.index)).sort_values(["model", "order"])
    table = pd.DataFrame(
        {
            "model": at["model"],
            "method": at["method"].map(plot_style.METHOD_LABELS),
            "budget": at["budget"],
            "tok/s": at["throughput"],
            "speedup": at["speedup"],
            "tau": at["tau"],
            "datasets": at["n_datasets"],
        }
    )
    caption = (
        f"Table 1: macro average over datasets at budget {smk.params.budget}, temperature {smk.params.temperature:g}"
    )
    plot_style.save_table(table, smk.output, caption)


main(snakemake)  # noqa: F821
