"""Teacher-forced tree acceptance: tau of whole draft trees at the headline budget, scored on the same anchors of the
target's own held-out continuations for every builder (python -m weaver.eval_depth --trees). At temperature 0 a tree
accepts the longest path that matches the continuation; at temperature > 0 tau is the expected acceptance length under
the verifier. Unlike the benchmark, every builder sees exactly the same anchors, so the ratios between builders carry
no noise from diverging generations; each cell is the mean over n anchors.

Inputs: results/{run}/raw/depth/{model}.trees.csv (one per model). Outputs: figures/{run}/tree_tau.{md,tex}.
Columns: one per dataset, the macro mean over datasets, and the macro tau over DDTree's (where DDTree was scored).
"""

import sys

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402

KEYS = ["model", "temperature", "budget", "children", "method"]


def tree_table(trees: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, temperature, budget, method): tau per dataset, macro tau, anchors, macro over DDTree."""
    wide = trees.pivot_table(index=KEYS, columns="dataset", values="tau").reset_index()
    datasets = sorted(set(trees["dataset"]))
    wide["macro"] = wide[datasets].mean(axis=1)
    wide = wide.merge(trees.groupby(KEYS, as_index=False)["n"].sum().rename(columns={"n": "anchors"}), on=KEYS)
    ddtree = wide[wide["method"] == "ddtree"][[*KEYS[:-1], "macro"]].rename(columns={"macro": "ddtree"})
    wide = wide.merge(ddtree, on=KEYS[:-1], how="left")
    wide["vs DDTree"] = wide["macro"] / wide.pop("ddtree")
    rank = {method: i for i, method in enumerate(plot_style.METHOD_ORDER)}  # then pool_bound / oracle rows, if any
    wide = wide.assign(order=wide["method"].map(lambda m: rank.get(m, len(rank))))
    wide = wide.sort_values(["model", "temperature", "budget", "order", "method"]).drop(columns="order")
    wide["method"] = wide["method"].map(lambda m: plot_style.METHOD_LABELS.get(m, m))
    wide.columns.name = None
    return wide


def main(smk) -> None:
    trees = pd.concat([pd.read_csv(path) for path in smk.input.trees], ignore_index=True)
    caption = "Teacher-forced tau of whole trees (same anchors for every builder; python -m weaver.eval_depth --trees)"
    if trees.empty:
        caption += ": no tree rows in the logs"
    else:
        trees = tree_table(trees)
    plot_style.save_table(trees, smk.output, caption)


main(snakemake)  # noqa: F821
