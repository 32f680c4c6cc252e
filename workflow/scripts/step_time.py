"""Where a decoding step's time goes: per method and budget at the headline temperature, milliseconds per engine step
spent drafting, building the tree and verifying, the whole decode step, and the break-even tau (the acceptance length
at which the method would decode as fast as AR: its step time over AR's). A method beats AR only where its tau exceeds
its break-even tau, so this table explains the speedups of Table 1 (speedup ~ tau / break-even tau, prefill aside).

Times are pooled over each cell's requests (sum over steps / number of steps; the decode step is wall time minus time
to first token, per step), then averaged over datasets (macro), as every table here is.

Inputs: results/{run}/tidy/requests.csv. Outputs: figures/{run}/step_time.{md,tex}.
"""

import sys

import pandas as pd

sys.path.insert(0, snakemake.scriptdir)  # noqa: F821 (injected by Snakemake)
import plot_style  # noqa: E402

KEYS = ["host", "model", "method", "budget"]
PARTS = ["draft_s", "tree_s", "verify_s", "decode_s"]


def step_times(requests: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """One row per (host, model, method, budget): ms per step of each part, tau and the break-even tau vs AR."""
    at = requests[requests["temperature"] == temperature]
    at = at.assign(decode_s=at["wall_s"] - at["ttft_s"])
    cells = at.groupby([*KEYS, "dataset"], as_index=False)[[*PARTS, "steps", "tau"]].agg(
        {**dict.fromkeys(PARTS, "sum"), "steps": "sum", "tau": "mean"}
    )
    for part in PARTS:
        cells[part] = 1000 * cells[part] / cells["steps"]
    macro = cells.groupby(KEYS, as_index=False)[[*PARTS, "tau"]].mean()
    ar = macro[macro["method"] == "ar"][["host", "model", "decode_s"]].rename(columns={"decode_s": "ar_step"})
    macro = macro.merge(ar, on=["host", "model"], how="left")
    macro["break_even"] = macro["decode_s"] / macro["ar_step"]  # NaN where the logs hold no AR cell
    macro = macro.assign(order=macro["method"].map(plot_style.METHOD_ORDER.index))
    return macro.sort_values(["host", "model", "budget", "order"]).drop(columns=["order", "ar_step"])


def main(smk) -> None:
    requests = pd.read_csv(smk.input.requests)
    temperature = smk.params.temperature
    times = step_times(requests, temperature)
    table = pd.DataFrame(
        {
            "model": times["model"],
            "method": times["method"].map(plot_style.METHOD_LABELS),
            "budget": times["budget"],
            "draft ms": times["draft_s"],
            "tree ms": times["tree_s"],
            "verify ms": times["verify_s"],
            "step ms": times["decode_s"],
            "tau": times["tau"],
            "break-even tau": times["break_even"],
        }
    )
    caption = f"Milliseconds per decoding step at temperature {temperature:g} and the tau each method needs to match AR"
    if table.empty:
        caption += f": no requests at temperature {temperature:g} in the logs"
    plot_style.save_table(table, smk.output, caption)


main(snakemake)  # noqa: F821
