"""Figure and table: GDN tree-verify time per layer vs tree size N, per-branch recurrent verification vs the fused
masked solve (METHOD.md section 7; the paper's kernel table), with the fused speedup.

Inputs: results/{run}/tidy/kernels.csv. Outputs: figures/{run}/gdn_kernel_time.{png,pdf,md,tex}.
"""

import sys

import pandas as pd
import seaborn as sns
from matplotlib.ticker import NullLocator

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    plot_style.apply()
    kernels = pd.read_csv(smk.input.kernels)
    # one line per implementation, named with its backend and timing where a table holds several (a GPU table times
    # Triton and CUDA, in CUDA graphs and eagerly)
    series = kernels["impl"].astype(str)
    for column in ("backend", "timing"):
        if kernels[column].nunique() > 1:
            series = series + " " + kernels[column].astype(str)
    plot = kernels.assign(series=series)
    grid = sns.relplot(
        data=plot, x="n", y="time_us", hue="series", style="series", kind="line", marker="o", height=3.2, col="layout"
    )
    grid.set(yscale="log", xlabel="tree size N (nodes)", ylabel="time per layer (us)")
    sizes = sorted(kernels["n"].unique())
    for ax in grid.axes.flat:  # the measured sizes as ticks of a base-2 axis (no overlapping minor labels)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
    figures = [p for p in smk.output if p.endswith((".png", ".pdf"))]
    tables = [p for p in smk.output if p.endswith((".md", ".tex"))]
    plot_style.save_figure(grid.figure, figures)
    plot_style.save_table(kernels, tables, "GDN tree verification per layer: time (us) and speedup over per-branch")


main(snakemake)  # noqa: F821
