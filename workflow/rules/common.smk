# Config validation, wildcard constraints, and the lists of cells and artifacts the other rule files use.
import itertools
import os
import re
import shlex
import sys

import jsonschema
import yaml

sys.path.insert(0, workflow.basedir)  # weaver.paths of this checkout, even without `pip install -e .`
# Jobs run `python -m weaver...`: the interpreter running Snakemake comes first on their PATH, so that
# `.venv/bin/snakemake` works without an activated venv (local jobs and sbatch jobs inherit this environment).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

from weaver import paths


DRAFTER_METHODS = frozenset({"chain", "ddtree", "weaver", "weaver_chain"})  # methods that draft from the drafter
ADAPTER_METHODS = frozenset({"weaver", "weaver_chain"})  # ... and those that also need the Weaver adapter


def fill_defaults(instance, schema):
    """Fill schema defaults into the config in place (objects only; the schema gives every default)."""
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = sub["default"]
        if isinstance(instance.get(key), dict):
            fill_defaults(instance[key], sub)


def validate_config(config, schema_path):
    """Refuse a bad config at once, naming every bad key and what it allows."""
    schema = yaml.safe_load(open(schema_path))
    problems = []
    for error in jsonschema.Draft202012Validator(schema).iter_errors(config):
        key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        message = error.message
        if error.validator == "additionalProperties":
            message += f"; allowed keys: {sorted(error.schema.get('properties', {}))}"
        problems.append(f"config key {key}: {message}")
    if problems:
        raise ValueError("invalid config:\n  " + "\n  ".join(sorted(problems)))
    fill_defaults(config, schema)
    for grid in config["grids"]:
        for model in grid["models"]:
            if model not in config["models"]:
                raise ValueError(f"config key grids.models: {model!r} is not one of the models {list(config['models'])}")
        for dataset in grid["datasets"]:
            if dataset not in config["datasets"]:
                raise ValueError(f"config key grids.datasets: {dataset!r} has no prompt count under `datasets:`")
        for method in grid.get("budget_free", []):
            if method not in grid["methods"] or method == "ar":
                raise ValueError(
                    f"config key grids.budget_free: {method!r} is not a tree method of the same grid {grid['methods']}"
                )
    scored = set(config["figures"]["tree_methods"])  # empty: no teacher-forced trees (no table tree_tau)
    for model in config["models"]:
        benched = {m for grid in config["grids"] if model in grid["models"] for m in grid["methods"]}
        if scored and benched & DRAFTER_METHODS and not benched & scored:
            raise ValueError(
                f"config key figures.tree_methods: none of {sorted(scored)} is benchmarked for {model!r} (its grids:"
                f" {sorted(benched)}), so eval_depth would score no tree; add one of {sorted(benched & DRAFTER_METHODS)}"
            )
    for model, spec in config["models"].items():
        served = {
            paths.temperature_label(t)
            for grid in config["grids"]
            if model in grid["models"] and set(grid["methods"]) & ADAPTER_METHODS
            for t in grid["temperatures"]
        }
        labels = [paths.temperature_label(e["temperature"]) for e in spec["adapter"].get("per_temperature", [])]
        for label in labels:
            if labels.count(label) > 1:
                raise ValueError(
                    f"config key models.{model}.adapter.per_temperature: temperature {label} is listed twice; keep one"
                )
            if served and label not in served:  # (a model no grid runs Weaver on trains no adapter at all)
                raise ValueError(
                    f"config key models.{model}.adapter.per_temperature: no grid runs Weaver on {model!r} at"
                    f" temperature {label} (Weaver's temperatures: {sorted(served)}); drop the entry or add the"
                    " temperature to a grid"
                )
            name = paths.adapter_name(model, float(label))
            if name in config["models"]:
                raise ValueError(
                    f"config key models: {name!r} names both a model and the temperature-{label} adapter of"
                    f" {model!r}; rename the model"
                )
    if config["weaver_children"] != 8 and config["backend"] != "engine":
        raise ValueError(
            f"config key weaver_children: {config['weaver_children']} needs backend engine (got {config['backend']!r}:"
            " an SGLang server builds Weaver trees with its own fan-out); use 8 or backend engine"
        )


validate_config(config, workflow.source_path("../schemas/config.schema.yaml"))

RUN = config["run"]
THREADS = config["threads"]
GPUS = config["gpus_per_job"]


def args(items):
    """Shell-quoted pass-through arguments from the config."""
    return " ".join(shlex.quote(str(a)) for a in items)


def cells():
    """Every benchmark cell of every grid as (model, dataset, method, budget, temperature); ar has budget 0."""
    seen = {}
    for grid in config["grids"]:
        for model, dataset, method, temperature in itertools.product(
            grid["models"], grid["datasets"], grid["methods"], grid["temperatures"]
        ):
            if method == "ar":
                budgets = [0]
            elif method in grid.get("budget_free", []):
                budgets = [min(grid["budgets"])]  # the analysis reuses this run for the larger budgets
            else:
                budgets = grid["budgets"]
            for budget in budgets:
                seen[(model, dataset, method, budget, paths.temperature_label(temperature))] = None
    return list(seen)


BUDGET_FREE = sorted({method for grid in config["grids"] for method in grid.get("budget_free", [])})


def adapters():
    """Every adapter by its name in paths (weaver.paths.adapter_name): (model, recipe)."""
    found = {}
    for model, spec in config["models"].items():
        found[paths.adapter_name(model)] = (model, spec["adapter"])
        for entry in spec["adapter"].get("per_temperature", []):
            found[paths.adapter_name(model, entry["temperature"])] = (model, entry)
    return found


ADAPTERS = adapters()


def adapter_for(model, temperature=None):
    """Name of the adapter that serves `model` at `temperature` (a label): its per_temperature one, else the default
    (also for None)."""
    name = paths.adapter_name(model, None if temperature is None else float(temperature))
    return name if name in ADAPTERS else paths.adapter_name(model)


CELLS = cells()
META = [paths.META.format(run=RUN, model=m, dataset=d, method=x, budget=b, temperature=t) for m, d, x, b, t in CELLS]
KERNEL_BENCH = paths.KERNEL_BENCH.format(run=RUN) if "kernel_bench" in config else None
TIDY = {table: str(paths.tidy_path(RUN, table)) for table in paths.TIDY_TABLES}
FIGURE_DIR = paths.FIGURE_DIR.format(run=RUN)
ARTIFACT_EXTS = {
    "table1": ["md", "tex"],
    "per_dataset": ["md", "tex"],
    "tau_ratios": ["md", "tex"],
    "tau_vs_budget": ["png", "pdf"],
    "depth_acceptance": ["png", "pdf"],
    "speedup_vs_budget": ["png", "pdf"],
    "step_time": ["md", "tex"],
}
if config["figures"]["tree_methods"]:
    ARTIFACT_EXTS["tree_tau"] = ["md", "tex"]
if KERNEL_BENCH:
    ARTIFACT_EXTS["gdn_kernel_time"] = ["png", "pdf", "md", "tex"]
ARTIFACTS = [str(paths.figure_path(RUN, name, ext)) for name, exts in ARTIFACT_EXTS.items() for ext in exts]


REPORT_DIR = os.path.join(workflow.basedir, "workflow", "report")


def artifact(name):
    """The outputs of one figure or table script; the PNG and the Markdown table go into `snakemake --report`."""
    outputs = []
    for ext in ARTIFACT_EXTS[name]:
        path = str(paths.figure_path(RUN, name, ext))
        if ext in ("png", "md"):
            category = "Figures" if ext == "png" else "Tables"
            path = report(path, caption=os.path.join(REPORT_DIR, f"{name}.rst"), category=category)
        outputs.append(path)
    return outputs


wildcard_constraints:
    run=re.escape(RUN),
    model="|".join(map(re.escape, config["models"])),
    adapter="|".join(map(re.escape, ADAPTERS)),
    dataset="|".join(config["datasets"]),
    method="[a-z_]+",
    budget=r"\d+",
    temperature=r"[0-9.]+",


def log(rule, job="{model}"):
    return paths.LOG.format(run="{run}", rule=rule, job=job)
