"""Figure: per-depth acceptance rate P(draft at depth d accepted | depth d - 1 reached) of the argmax of the
drafter's marginals (DFlash chain) vs Weaver (chain and tree), at the headline budget (the paper's Figure 4
effect: factorized drafts lose acceptance with depth, the autoregressive adapter keeps it).

Inputs: results/{run}/tidy/depth_acceptance.csv. Outputs: figures/{run}/depth_acceptance.{png,pdf}.
"""

import sys

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    plot_style.apply()
    depth = pd.read_csv(smk.input.depth)
    depth = depth[depth["method"].isin(smk.params.methods) & (depth["budget"] == smk.params.budget)]
    if depth.empty:
        fig, ax = plt.subplots(figsize=(4, 3))
        plot_style.empty_note(ax, f"per-depth data for {smk.params.methods} at budget {smk.params.budget}")
        plot_style.save_figure(fig, smk.output)
        return
    grid = sns.relplot(
        data=depth,
        x="depth",
        y="rate",
        hue="method",
        hue_order=plot_style.methods_in(depth),
        palette=plot_style.PALETTE,
        col="model",
        row="temperature",
        kind="line",
        marker="o",
        height=3,
    )
    grid.set(xlabel="draft depth d", ylabel="acceptance at depth d", ylim=(0, 1.02))
    plot_style.save_figure(grid.figure, smk.output)


main(snakemake)  # noqa: F821
