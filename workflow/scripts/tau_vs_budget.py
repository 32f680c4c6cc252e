"""Figure: acceptance length tau (macro average over datasets) vs tree budget, per method and model; the tree
methods (DDTree, Weaver) keep gaining with the budget where a chain of marginals saturates (METHOD.md section 2).

Inputs: results/{run}/tidy/macro.csv. Outputs: figures/{run}/tau_vs_budget.{png,pdf}.
"""

import sys

import pandas as pd
import seaborn as sns

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    plot_style.apply()
    macro = pd.read_csv(smk.input.macro)
    macro = macro[macro["method"] != "ar"]
    grid = sns.relplot(
        data=macro,
        x="budget",
        y="tau",
        hue="method",
        hue_order=plot_style.methods_in(macro),
        palette=plot_style.PALETTE,
        col="model",
        row="temperature",
        kind="line",
        marker="o",
        height=3,
        facet_kws={"sharey": False},
    )
    grid.set(xscale="log", xlabel="tree budget (drafted nodes)", ylabel="tau (tokens / step)")
    plot_style.save_figure(grid.figure, smk.output)


main(snakemake)  # noqa: F821
