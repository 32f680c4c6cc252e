# Targets the pipeline builds (the GDN hybrid), then per target: cached features + drafter, and the Weaver adapter.
# Jobs set OMP_NUM_THREADS so that `--cores` bounds the CPU threads actually used. Priorities put the critical path
# (hybrid -> drafter -> adapter -> per-depth eval) ahead of benchmark cells, which fill the idle cores around it.


def target_arg(model):
    """What weaver.models.load_target gets: the built folder, or the registry name / folder of the config."""
    spec = config["models"][model]
    return paths.MODEL_DIR.format(run=RUN, model=model) if "build" in spec else spec["target"]


def target_input(model):
    return [target_arg(model)] if "build" in config["models"][model] else []


def checkpoint_of(model, kind, temperature=None):
    """A pretrained checkpoint path from the config, or the one this pipeline trains; for the adapter, the one that
    serves `temperature` (a label; None: the model's default adapter)."""
    if kind == "drafter":
        spec = config["models"][model]["drafter"]
        return spec.get("path", paths.DRAFTER_DIR.format(run=RUN, model=model))
    return adapter_path(adapter_for(model, temperature))


def checkpoint_input(model, kind, temperature=None):
    """Checkpoints this pipeline trains are inputs; pretrained ones are external (a dry run must work without)."""
    spec = config["models"][model]["drafter"] if kind == "drafter" else ADAPTERS[adapter_for(model, temperature)][1]
    return [] if "path" in spec else [checkpoint_of(model, kind, temperature)]


def adapter_path(name):
    """Checkpoint file of the adapter `name` (a key of ADAPTERS): its config path, or the one this pipeline trains."""
    return ADAPTERS[name][1].get("path", paths.ADAPTER.format(run=RUN, adapter=name))


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


def adapter_features(name):
    """The features adapter `name` trains on: its own set when its recipe gives features_args, else its drafter's."""
    model, recipe = ADAPTERS[name]
    if "features_args" in recipe:
        return paths.ADAPTER_FEATURES_DIR.format(run=RUN, adapter=name) + "/summary.json"
    return paths.FEATURES_DIR.format(run=RUN, model=model)


def adapter_model(wc):
    return ADAPTERS[wc.adapter][0]


# The adapter's own training data (more target completions than its drafter was trained on), for the drafter's taps.
# summary.json, written last, is the output: a failed or interrupted job leaves completions.jsonl and the finished
# shards in place and its rerun resumes at the first missing shard; after a change of features_args the command
# refuses the old folder (its meta.json names other data) and says to delete it.
rule adapter_features:
    input:
        target=lambda wc: target_input(adapter_model(wc)),
        drafter=lambda wc: checkpoint_input(adapter_model(wc), "drafter"),
    output:
        paths.ADAPTER_FEATURES_DIR + "/summary.json",
    log:
        log("adapter_features", "{adapter}"),
    params:
        target=lambda wc: target_arg(adapter_model(wc)),
        drafter=lambda wc: checkpoint_of(adapter_model(wc), "drafter"),
        out=lambda wc, output: os.path.dirname(output[0]),
        extra=lambda wc: args(ADAPTERS[wc.adapter][1]["features_args"]),
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
        target=lambda wc: target_input(adapter_model(wc)),
        drafter=lambda wc: checkpoint_input(adapter_model(wc), "drafter"),
        features=lambda wc: adapter_features(wc.adapter),
    output:
        paths.ADAPTER,
    log:
        log("train_adapter", "{adapter}"),
    params:
        target=lambda wc: target_arg(adapter_model(wc)),
        drafter=lambda wc: checkpoint_of(adapter_model(wc), "drafter"),
        features=lambda wc: adapter_features(wc.adapter).removesuffix("/summary.json"),
        out=lambda wc, output: os.path.dirname(output[0]),
        extra=lambda wc: args(ADAPTERS[wc.adapter][1]["train_args"]),
    priority: 10
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.train adapter --model {params.target} --drafter {params.drafter} "
        "--features {params.features} --out {params.out} --restart-if-changed {params.extra} > {log} 2>&1"
