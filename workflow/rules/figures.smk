# One script per paper table or figure (workflow/scripts/<name>.py; its docstring is the caption and its inputs).


rule figures:
    input:
        ARTIFACTS,


rule table1:
    input:
        macro=TIDY["macro"],
    output:
        artifact("table1"),
    params:
        budget=config["figures"]["headline_budget"],
        temperature=config["figures"]["headline_temperature"],
    log:
        paths.LOG.format(run=RUN, rule="figures", job="table1"),
    script:
        "../scripts/table1.py"


rule per_dataset:
    input:
        cells=TIDY["cells"],
    output:
        artifact("per_dataset"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="per_dataset"),
    script:
        "../scripts/per_dataset.py"


rule tau_ratios:
    input:
        macro=TIDY["macro"],
        requests=TIDY["requests"],
    output:
        artifact("tau_ratios"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="tau_ratios"),
    script:
        "../scripts/tau_ratios.py"


rule tau_vs_budget:
    input:
        macro=TIDY["macro"],
    output:
        artifact("tau_vs_budget"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="tau_vs_budget"),
    script:
        "../scripts/tau_vs_budget.py"


DEPTH_EVAL = paths.RUN + "/raw/depth/{model}.csv"  # teacher-forced per-depth acceptance (python -m weaver.eval_depth)
DEPTH_TREES = paths.RUN + "/raw/depth/{model}.trees.csv"  # teacher-forced whole trees on the same anchors


def grid_methods(model):
    return {method for grid in config["grids"] if model in grid["models"] for method in grid["methods"]}


def uses_adapter(model):
    """Weaver rows only where the grids benchmark Weaver (a model may have a drafter but no adapter to train)."""
    return bool(grid_methods(model) & ADAPTER_METHODS)


TREE_METHODS = config["figures"]["tree_methods"]  # empty: eval_depth scores no trees, no table tree_tau
DEPTH_OUTPUTS = {"marginals": DEPTH_EVAL} | ({"trees": DEPTH_TREES} if TREE_METHODS else {})


def tree_flags(wc, output):
    """eval_depth's --trees: the configured builders this model's grids benchmark, at the headline budget."""
    methods = [m for m in TREE_METHODS if m in grid_methods(wc.model)]  # empty only if TREE_METHODS is (checked)
    if not methods:
        return ""
    flags = ["--trees", *methods, "--budget", config["figures"]["headline_budget"], "--trees-out", output.trees]
    if uses_adapter(wc.model):
        flags += ["--children", config["weaver_children"]]
    return args(flags)


DEPTH_MODELS = [m for m in config["models"] if grid_methods(m) & DRAFTER_METHODS]
DEPTH_TEMPERATURES = sorted({paths.temperature_label(t) for g in config["grids"] for t in g["temperatures"]})


def depth_adapters(model):
    """The adapters eval_depth scores `model` with: temperature label -> adapter name (each label's own, if any)."""
    return {t: adapter_for(model, t) for t in DEPTH_TEMPERATURES} if uses_adapter(model) else {}


def depth_adapter_flags(wc):
    """--adapter for the temperatures the model's default adapter serves, --adapter-at T PATH for the others."""
    flags = []
    chosen = depth_adapters(wc.model)
    if paths.adapter_name(wc.model) in chosen.values():
        flags += ["--adapter", checkpoint_of(wc.model, "adapter")]
    for t, name in chosen.items():
        if name != paths.adapter_name(wc.model):
            flags += ["--adapter-at", t, adapter_path(name)]
    return args(flags)


rule eval_depth:
    input:
        target=lambda wc: target_input(wc.model),
        drafter=lambda wc: checkpoint_input(wc.model, "drafter"),
        adapter=lambda wc: sorted({p for t in depth_adapters(wc.model) for p in checkpoint_input(wc.model, "adapter", t)}),
    output:
        **DEPTH_OUTPUTS,
    log:
        log("eval_depth"),
    params:
        target=lambda wc: target_arg(wc.model),
        drafter=lambda wc: checkpoint_of(wc.model, "drafter"),
        adapter=depth_adapter_flags,
        datasets=" ".join(config["datasets"]),
        n=min(config["datasets"].values()),
        temperatures=" ".join(DEPTH_TEMPERATURES),
        trees=tree_flags,
    priority: 5
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.eval_depth --model {params.target} --model-name {wildcards.model} "
        "--drafter {params.drafter} {params.adapter} --dataset {params.datasets} --n-prompts {params.n} "
        "--max-new-tokens {config[max_new_tokens]} --temperatures {params.temperatures} --seed {config[seed]} "
        "--threads {threads} --out {output.marginals} {params.trees} > {log} 2>&1"


rule depth_acceptance:
    input:
        marginals=expand(DEPTH_EVAL, run=RUN, model=DEPTH_MODELS),
    output:
        artifact("depth_acceptance"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="depth_acceptance"),
    script:
        "../scripts/depth_acceptance.py"


if TREE_METHODS:

    rule tree_tau:
        input:
            trees=expand(DEPTH_TREES, run=RUN, model=DEPTH_MODELS),
        output:
            artifact("tree_tau"),
        log:
            paths.LOG.format(run=RUN, rule="figures", job="tree_tau"),
        script:
            "../scripts/tree_tau.py"


rule speedup_vs_budget:
    input:
        macro=TIDY["macro"],
    output:
        artifact("speedup_vs_budget"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="speedup_vs_budget"),
    script:
        "../scripts/speedup_vs_budget.py"


rule step_time:
    input:
        requests=TIDY["requests"],
    output:
        artifact("step_time"),
    params:
        temperature=config["figures"]["headline_temperature"],
    log:
        paths.LOG.format(run=RUN, rule="figures", job="step_time"),
    script:
        "../scripts/step_time.py"


if KERNEL_BENCH:

    rule gdn_kernel_time:
        input:
            kernels=TIDY["kernels"],
        output:
            artifact("gdn_kernel_time"),
        log:
            paths.LOG.format(run=RUN, rule="figures", job="gdn_kernel_time"),
        script:
            "../scripts/gdn_kernel_time.py"
