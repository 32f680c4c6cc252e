"""Figure: acceptance length tau (macro average over datasets) vs tree budget, per method and model; the tree
methods (DDTree, Weaver) keep gaining with the budget where a chain of marginals saturates (METHOD.md section 2).

Inputs: results/{run}/tidy/macro.csv. Outputs: figures/{run}/tau_vs_budget.{png,pdf}.
"""

import sys

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    plot_style.apply()
    grid = plot_style.versus_budget(smk.input.macro, "tau", "tau (tokens / step)", sharey=False)
    plot_style.save_figure(grid.figure, smk.output)


main(snakemake)  # noqa: F821
