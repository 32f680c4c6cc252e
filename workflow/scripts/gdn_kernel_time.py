"""Figure and table: GDN tree-verify time per layer vs tree size N, per-branch recurrent verification vs the fused
masked solve (METHOD.md section 7; the paper's kernel table), with the fused speedup.

Inputs: results/{run}/tidy/kernels.csv. Outputs: figures/{run}/gdn_kernel_time.{png,pdf,md,tex}.
"""

import sys

import pandas as pd
import seaborn as sns

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402


def main(smk) -> None:
    plot_style.apply()
    kernels = pd.read_csv(smk.input.kernels)
    layout = [c for c in kernels.columns if c not in ("n", "impl", "time_us", "speedup")]
    grid = (
        sns.relplot(
            data=kernels,
            x="n",
            y="time_us",
            hue="impl",
            style="impl",
            kind="line",
            marker="o",
            height=3.2,
            col=layout[0],
        )
        if layout
        else sns.relplot(data=kernels, x="n", y="time_us", hue="impl", kind="line", marker="o", height=3.2)
    )
    grid.set(xscale="log", yscale="log", xlabel="tree size N (nodes)", ylabel="time per layer (us)")
    figures = [p for p in smk.output if p.endswith((".png", ".pdf"))]
    tables = [p for p in smk.output if p.endswith((".md", ".tex"))]
    plot_style.save_figure(grid.figure, figures)
    plot_style.save_table(kernels, tables, "GDN tree verification per layer: time (us) and speedup over per-branch")


main(snakemake)  # noqa: F821
