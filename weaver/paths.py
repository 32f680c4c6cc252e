"""The one module that knows where results live (showyourwork's `paths.py` idea).

Every path is relative to the repository root (Snakemake's working directory). Patterns carry Snakemake-style
`{wildcards}`: the Snakefile uses them as rule outputs, and the `*_path` helpers fill them in for scripts and tests.

    results/{run}/models/{model}/                      targets the pipeline builds (the GDN hybrid)
    results/{run}/drafters/{model}/                    drafter checkpoint folder
    results/{run}/features/{model}/                    cached target features for training
    results/{run}/adapter_features/{adapter}/          the adapter's own features (when its config asks for them)
    results/{run}/adapters/{adapter}/adapter.pt        Weaver adapter checkpoint
    results/{run}/kernels/build.json                   kernel build report
    results/{run}/raw/bench/{model}/{dataset}/{method}/b{budget}-t{temperature}/{records.jsonl,meta.json}
    results/{run}/raw/kernels/kernel_table.csv         GDN kernel bench (python -m weaver_kernels.bench)
    results/{run}/tidy/*.csv                           analysis tables (weaver.analyze)
    results/{run}/logs/{rule}/...log                   one log per job
    figures/{run}/*.{png,pdf,md,tex}                   paper figures and tables

An `{adapter}` is named after its model, `{model}`, or `{model}.t{temperature}` for one that serves a single target
temperature (`models.*.adapter.per_temperature` in the config; `adapter_name`).
"""

from __future__ import annotations

from pathlib import Path

RESULTS = "results"
FIGURES = "figures"

RUN = RESULTS + "/{run}"
MODEL_DIR = RUN + "/models/{model}"
DRAFTER_DIR = RUN + "/drafters/{model}"
FEATURES_DIR = RUN + "/features/{model}"  # cached target features (drafter and adapter training)
ADAPTER_FEATURES_DIR = RUN + "/adapter_features/{adapter}"  # the adapter's own set (models.*.adapter.features_args)
ADAPTER = RUN + "/adapters/{adapter}/adapter.pt"
KERNEL_BUILD = RUN + "/kernels/build.json"
CELL_DIR = RUN + "/raw/bench/{model}/{dataset}/{method}/b{budget}-t{temperature}"
RECORDS = CELL_DIR + "/records.jsonl"
META = CELL_DIR + "/meta.json"  # written last: the completion marker of a cell
KERNEL_BENCH = RUN + "/raw/kernels/kernel_table.csv"
TIDY = RUN + "/tidy/{table}.csv"
LOG = RUN + "/logs/{rule}/{job}.log"
FIGURE_DIR = FIGURES + "/{run}"

TIDY_TABLES = ("requests", "cells", "macro", "depth_acceptance", "kernels")


def temperature_label(temperature: float) -> str:
    """Canonical text of a temperature in paths and records: 0 -> "0", 1.0 -> "1", 0.7 -> "0.7"."""
    return f"{float(temperature):g}"


def adapter_name(model: str, temperature: float | None = None) -> str:
    """Name of an adapter in paths: `model`, or `model.t<label>` for one trained for a single target temperature."""
    return model if temperature is None else f"{model}.t{temperature_label(temperature)}"


def cell_dir(run: str, model: str, dataset: str, method: str, budget: int, temperature: float) -> Path:
    """Folder of one benchmark cell (records.jsonl + meta.json)."""
    return Path(
        CELL_DIR.format(
            run=run,
            model=model,
            dataset=dataset,
            method=method,
            budget=int(budget),
            temperature=temperature_label(temperature),
        )
    )


def tidy_path(run: str, table: str) -> Path:
    """One tidy CSV of weaver.analyze; `table` is one of TIDY_TABLES."""
    if table not in TIDY_TABLES:
        raise KeyError(f"unknown tidy table {table!r}; available: {', '.join(TIDY_TABLES)}")
    return Path(TIDY.format(run=run, table=table))


def figure_path(run: str, name: str, ext: str) -> Path:
    """A figure or table artifact, e.g. figure_path("cpu", "table1", "md")."""
    return Path(FIGURE_DIR.format(run=run)) / f"{name}.{ext}"
