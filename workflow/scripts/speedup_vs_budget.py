"""Figure: speedup over AR (macro average over datasets) vs tree budget, per method and model; where the curve
turns down, verifying a wider tree costs more on this hardware than the extra accepted tokens gain.

Inputs: results/{run}/tidy/macro.csv. Outputs: figures/{run}/speedup_vs_budget.{png,pdf}.
"""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    plot_style.apply()
    grid = plot_style.versus_budget(smk.input.macro, "speedup", "speedup over AR")
    for ax in grid.axes.flat:
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    plot_style.save_figure(grid.figure, smk.output)


main(snakemake)  # noqa: F821
