"""The paper's central comparison in one table: macro acceptance length tau of the three tree builders at equal budget
(DFlash chain, DDTree, Weaver tree) and the ratios between them, per model, temperature and budget. The paper's effect
is Weaver > DDTree > chain with the gap growing with the budget (+32% over DDTree, +77% over the chain at budget 64).

The headline ratio, Weaver / DDTree, comes with a 95% interval from a paired bootstrap over prompts: each resample
draws every dataset's prompts with replacement (the same prompts for both builders), and the ratio of the two macro
means is recomputed; 2000 resamples, seeded. It measures how much the ratio depends on which prompts were drawn (at
temperature 1 each prompt's own sampled continuation included), not the spread over reruns of the same prompts.

Where the records carry each step's expected accept length (weaver.analyze's tau_expected: tau with most of the
verifier's sampling noise taken out), the same ratio and interval follow on tau_expected. At temperature 0 they
equal the columns on tau; at temperature 1 they are the sharper estimate.

Inputs: results/{run}/tidy/macro.csv and requests.csv. Outputs: figures/{run}/tau_ratios.{md,tex}. A ratio column
appears only where both of its methods were benchmarked.
"""

import sys

import numpy as np
import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402

BUILDERS = ["chain", "ddtree", "weaver"]
RATIOS = [("weaver", "ddtree"), ("weaver", "chain"), ("ddtree", "chain")]
SHORT = {"chain": "chain", "ddtree": "DDTree", "weaver": "Weaver"}  # ratio column names


RESAMPLES = 2000
CI_COLUMN = "Weaver / DDTree, 95% CI"
EXPECTED_COLUMN = "Weaver / DDTree, expected"
EXPECTED_CI_COLUMN = "expected, 95% CI"


def paired_taus(requests: pd.DataFrame, num: str, den: str, value: str = "tau") -> dict[tuple, list[np.ndarray]]:
    """(model, temperature, budget) -> per dataset, an array [prompts, 2] of the (num, den) `value` column on the
    prompts both ran."""
    keys = ["model", "temperature", "budget", "dataset", "prompt_id"]
    pair = requests[requests["method"] == num][[*keys, value]].merge(
        requests[requests["method"] == den][[*keys, value]], on=keys, suffixes=("_num", "_den")
    )
    out: dict[tuple, list[np.ndarray]] = {}
    for (model, temperature, budget, _), rows in pair.groupby(keys[:4], sort=True):
        out.setdefault((model, temperature, budget), []).append(rows[[f"{value}_num", f"{value}_den"]].to_numpy(float))
    return out


def bootstrap_interval(datasets: list[np.ndarray], resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """2.5 and 97.5 percentiles of macro(num) / macro(den) over resamples of each dataset's prompts (paired)."""
    rng = np.random.default_rng(seed)
    num, den = np.zeros(resamples), np.zeros(resamples)
    for taus in datasets:
        picks = rng.integers(0, len(taus), size=(resamples, len(taus)))
        means = taus[picks].mean(axis=1)  # [resamples, 2]
        num += means[:, 0] / len(datasets)
        den += means[:, 1] / len(datasets)
    low, high = np.percentile(num / den, [2.5, 97.5])
    return float(low), float(high)


def intervals(wide: pd.DataFrame, pairs: dict[tuple, list[np.ndarray]]) -> list[str]:
    """The bootstrap interval of each (model, temperature, budget) row of `wide` as text ("" where a row has no
    pairs, or a pair lacks the value)."""
    out = []
    for key in wide[["model", "temperature", "budget"]].itertuples(index=False):
        datasets = pairs.get(tuple(key))
        ok = datasets is not None and all(np.isfinite(d).all() for d in datasets)
        out.append("[{:.2f}, {:.2f}]".format(*bootstrap_interval(datasets)) if ok else "")
    return out


def ratio_table(macro: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, temperature, budget): tau of each builder present, the ratios between them and, from the
    per-prompt requests, the paired-bootstrap interval of Weaver / DDTree."""
    trees = macro[macro["method"].isin(BUILDERS)]
    wide = trees.pivot_table(index=["model", "temperature", "budget"], columns="method", values="tau").reset_index()
    present = [m for m in BUILDERS if m in wide.columns]
    for num, den in RATIOS:
        if num in present and den in present:
            wide[f"{SHORT[num]} / {SHORT[den]}"] = wide[num] / wide[den]
    if {"weaver", "ddtree"} <= set(present):
        wide[CI_COLUMN] = intervals(wide, paired_taus(requests, "weaver", "ddtree"))
        if trees["tau_expected"].notna().any():
            expected = trees.pivot_table(
                index=["model", "temperature", "budget"], columns="method", values="tau_expected", dropna=False
            ).reset_index()
            wide = wide.merge(
                expected.assign(**{EXPECTED_COLUMN: expected["weaver"] / expected["ddtree"]})[
                    ["model", "temperature", "budget", EXPECTED_COLUMN]
                ],
                on=["model", "temperature", "budget"],
                how="left",
            )
            wide[EXPECTED_CI_COLUMN] = intervals(wide, paired_taus(requests, "weaver", "ddtree", "tau_expected"))
    wide = wide.rename(columns={m: plot_style.METHOD_LABELS[m] for m in present})
    wide.columns.name = None
    return wide.sort_values(["model", "temperature", "budget"])


def main(smk) -> None:
    macro = pd.read_csv(smk.input.macro)
    columns = ["model", "dataset", "method", "budget", "temperature", "prompt_id", "tau", "tau_expected"]
    requests = pd.read_csv(smk.input.requests, usecols=columns)
    caption = (
        "Macro tau of the tree builders at equal budget and the ratios between them; Weaver / DDTree with a 95%"
        f" paired-bootstrap interval over prompts ({RESAMPLES} resamples, stratified by dataset)"
    )
    table = ratio_table(macro, requests)
    if table.empty:
        caption += ": no chain, DDTree or Weaver cells in the logs"
    plot_style.save_table(table, smk.output, caption)


main(snakemake)  # noqa: F821
