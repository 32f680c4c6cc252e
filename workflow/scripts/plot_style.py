"""The one plot and table style every figure script shares: seaborn theme, method colours and names, writers."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: cluster nodes and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

METHOD_ORDER = ["ar", "prompt_lookup", "chain", "ddtree", "weaver_chain", "weaver"]
METHOD_LABELS = {
    "ar": "AR",
    "prompt_lookup": "Prompt lookup",
    "chain": "DFlash chain",
    "ddtree": "DDTree",
    "weaver_chain": "Weaver chain",
    "weaver": "Weaver tree",
}
PALETTE = dict(zip(METHOD_ORDER, sns.color_palette("colorblind", len(METHOD_ORDER)), strict=True))


def apply() -> None:
    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)


def methods_in(frame: pd.DataFrame) -> list[str]:
    """The methods present in a table, in the house order (legends agree across figures)."""
    present = set(frame["method"])
    return [m for m in METHOD_ORDER if m in present]


def versus_budget(macro_csv: str, y: str, ylabel: str, sharey: bool = True) -> sns.FacetGrid:
    """Line plot of `y` vs tree budget per method (colour), model (column) and temperature (row), AR left out."""
    macro = pd.read_csv(macro_csv)
    macro = macro[macro["method"] != "ar"]
    grid = sns.relplot(
        data=macro,
        x="budget",
        y=y,
        hue="method",
        hue_order=methods_in(macro),
        palette=PALETTE,
        col="model",
        row="temperature",
        kind="line",
        marker="o",
        height=3,
        facet_kws={"sharey": sharey},
    )
    grid.set(xscale="log", xlabel="tree budget (drafted nodes)", ylabel=ylabel)
    return grid


def save_figure(fig: plt.Figure, outputs: list[str]) -> None:
    """Write one figure to every output path (PNG and PDF)."""
    for path in outputs:
        fig.savefig(path, bbox_inches="tight", dpi=200)
    plt.close(fig)


LATEX_SPECIALS = {c: "\\" + c for c in "%_#$&{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
}


def latex_escape(text: str) -> str:
    """Text for LaTeX: %, _, #, $, &, braces, ~, ^ and backslash escaped (names such as transformers_ar, "95% CI")."""
    return "".join(LATEX_SPECIALS.get(c, c) for c in text)


def save_table(table: pd.DataFrame, outputs: list[str], caption: str) -> None:
    """Write one table as Markdown (.md) and LaTeX (.tex), by the extension of each output; the LaTeX escapes the
    caption, the headers and the cells."""
    for path in outputs:
        suffix = Path(path).suffix
        if suffix == ".md":
            Path(path).write_text(f"{caption}\n\n{table.to_markdown(index=False, floatfmt='.2f')}\n")
        elif suffix == ".tex":
            latex = table.to_latex(index=False, float_format="%.2f", caption=latex_escape(caption), escape=True)
            Path(path).write_text(latex)


def empty_note(ax: plt.Axes, what: str) -> None:
    """Say on the figure that its data is absent, rather than draw an empty plot that looks like a result."""
    ax.text(0.5, 0.5, f"no {what} in the logs", ha="center", va="center", transform=ax.transAxes)
