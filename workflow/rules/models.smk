# Targets the pipeline builds (the GDN hybrid), then per target: cached features + drafter, and the Weaver adapter.
# Jobs set OMP_NUM_THREADS so that `--cores` bounds the CPU threads actually used. Priorities put the critical path
# (hybrid -> drafter -> adapter -> per-depth eval) ahead of benchmark cells, which fill the idle cores around it.


def target_arg(model):
    """What weaver.models.load_target gets: the built folder, or the registry name / folder of the config."""
    spec = config["models"][model]
    return paths.MODEL_DIR.format(run=RUN, model=model) if "build" in spec else spec["target"]


def target_input(model):
    return [target_arg(model)] if "build" in config["models"][model] else []


def checkpoint_of(model, kind):
    """A pretrained checkpoint path from the config, or the one this pipeline trains."""
    spec = config["models"][model][kind]
    if "path" in spec:
        return spec["path"]
    pattern = paths.DRAFTER_DIR if kind == "drafter" else paths.ADAPTER
    return pattern.format(run=RUN, model=model)


def checkpoint_input(model, kind):
    """Checkpoints this pipeline trains are inputs; pretrained ones are external (a dry run must work without)."""
    return [] if "path" in config["models"][model][kind] else [checkpoint_of(model, kind)]


rule build_hybrid:
    output:
        directory(paths.MODEL_DIR),
    log:
        log("build_hybrid"),
    params:
        extra=lambda wc: args(config["models"][wc.model].get("build_args", [])),
    priority: 30
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.train hybrid --out {output} {params.extra} > {log} 2>&1"


rule train_drafter:
    input:
        lambda wc: target_input(wc.model),
    output:
        drafter=directory(paths.DRAFTER_DIR),
        features=directory(paths.FEATURES_DIR),
    log:
        log("train_drafter"),
    params:
        target=lambda wc: target_arg(wc.model),
        extra=lambda wc: args(config["models"][wc.model]["drafter"]["train_args"]),
    priority: 20
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.train drafter --model {params.target} --out {output.drafter} "
        "--features {output.features} {params.extra} > {log} 2>&1"


def adapter_features(model):
    """The features the adapter trains on: its own set when the config gives features_args, else the drafter's."""
    if "features_args" in config["models"][model]["adapter"]:
        return paths.ADAPTER_FEATURES_DIR.format(run=RUN, model=model) + "/summary.json"
    return paths.FEATURES_DIR.format(run=RUN, model=model)


# The adapter's own training data (more target completions than its drafter was trained on), for the drafter's taps.
# summary.json, written last, is the output: a failed or interrupted job leaves completions.jsonl and the finished
# shards in place and its rerun resumes at the first missing shard; after a change of features_args the command
# refuses the old folder (its meta.json names other data) and says to delete it.
rule adapter_features:
    input:
        target=lambda wc: target_input(wc.model),
        drafter=lambda wc: checkpoint_input(wc.model, "drafter"),
    output:
        paths.ADAPTER_FEATURES_DIR + "/summary.json",
    log:
        log("adapter_features"),
    params:
        target=lambda wc: target_arg(wc.model),
        drafter=lambda wc: checkpoint_of(wc.model, "drafter"),
        out=lambda wc, output: os.path.dirname(output[0]),
        extra=lambda wc: args(config["models"][wc.model]["adapter"]["features_args"]),
    priority: 15
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.train features --model {params.target} --drafter {params.drafter} "
        "--out {params.out} {params.extra} > {log} 2>&1"


# adapter.pt is the output, train_state.pt beside it is not: an interrupted job resumes from it, and a job rerun because
# its params changed moves it aside (--restart-if-changed) instead of resuming under other settings.
rule train_adapter:
    input:
        target=lambda wc: target_input(wc.model),
        drafter=lambda wc: checkpoint_input(wc.model, "drafter"),
        features=lambda wc: adapter_features(wc.model),
    output:
        paths.ADAPTER,
    log:
        log("train_adapter"),
    params:
        target=lambda wc: target_arg(wc.model),
        drafter=lambda wc: checkpoint_of(wc.model, "drafter"),
        features=lambda wc: adapter_features(wc.model).removesuffix("/summary.json"),
        out=lambda wc, output: os.path.dirname(output[0]),
        extra=lambda wc: args(config["models"][wc.model]["adapter"]["train_args"]),
    priority: 10
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.train adapter --model {params.target} --drafter {params.drafter} "
        "--features {params.features} --out {params.out} --restart-if-changed {params.extra} > {log} 2>&1"
