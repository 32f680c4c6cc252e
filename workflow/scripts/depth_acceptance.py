"""Figure 4: per-depth acceptance of one draft at depth d, teacher-forced on the target's own held-out continuations
(python -m weaver.eval_depth): the argmax of the drafter's marginal (what a DFlash chain drafts) vs a sample from it,
and Weaver's path-conditioned greedy draft and sample. The paper's observation (METHOD.md section 2): the argmax beats
the sample from depth 2-4 on, even at temperature 1; the autoregressive adapter stays above both.

Inputs: results/{run}/raw/depth/{model}.csv (one per model). Outputs: figures/{run}/depth_acceptance.{png,pdf}.
Lines are means over the datasets, weighted by the number of scored (anchor, depth) pairs.
"""

import sys

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402

DRAFT_LABELS = {
    "argmax": "argmax of marginal",
    "sample": "sample of marginal",
    "weaver_argmax": "Weaver greedy",
    "weaver_sample": "Weaver sample",
}


def pooled(frame: pd.DataFrame) -> pd.DataFrame:
    """Acceptance per (model, temperature, draft, depth), the n-weighted mean over datasets."""
    frame = frame.assign(weighted=frame["acceptance"] * frame["n"])
    keys = ["model", "temperature", "draft", "depth"]
    sums = frame.groupby(keys, as_index=False)[["weighted", "n"]].sum()
    return sums.assign(acceptance=sums["weighted"] / sums["n"])


def main(smk) -> None:
    plot_style.apply()
    depth = pd.concat([pd.read_csv(path) for path in smk.input.marginals], ignore_index=True)
    if depth.empty:
        fig, ax = plt.subplots(figsize=(4, 3))
        plot_style.empty_note(ax, "per-depth acceptance rows")
        plot_style.save_figure(fig, smk.output)
        return
    depth = pooled(depth)
    depth["draft"] = depth["draft"].map(DRAFT_LABELS)
    grid = sns.relplot(
        data=depth,
        x="depth",
        y="acceptance",
        hue="draft",
        hue_order=[label for label in DRAFT_LABELS.values() if label in set(depth["draft"])],
        col="model",
        row="temperature",
        kind="line",
        marker="o",
        height=3,
    )
    grid.set(xlabel="draft depth d", ylabel="P(accept depth d | prefix)", ylim=(0, 1.02))
    plot_style.save_figure(grid.figure, smk.output)


main(snakemake)  # noqa: F821
