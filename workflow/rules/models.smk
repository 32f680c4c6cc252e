# Targets the pipeline builds (the GDN hybrid), then the drafter and the Weaver adapter trained on each target.


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


rule build_hybrid:
    output:
        directory(paths.MODEL_DIR),
    log:
        log("build_hybrid"),
    params:
        base=lambda wc: config["models"][wc.model]["target"],
        extra=lambda wc: args(config["models"][wc.model].get("build_args", [])),
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "python -m weaver.train hybrid --base {params.base} --out {output} --threads {threads} {params.extra} "
        "> {log} 2>&1"


rule train_drafter:
    input:
        lambda wc: target_input(wc.model),
    output:
        directory(paths.DRAFTER_DIR),
    log:
        log("train_drafter"),
    params:
        target=lambda wc: target_arg(wc.model),
        extra=lambda wc: args(config["models"][wc.model]["drafter"]["train_args"]),
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "python -m weaver.train drafter --target {params.target} --out {output} --threads {threads} {params.extra} "
        "> {log} 2>&1"


rule train_adapter:
    input:
        target=lambda wc: target_input(wc.model),
        drafter=lambda wc: checkpoint_of(wc.model, "drafter"),
    output:
        paths.ADAPTER,
    log:
        log("train_adapter"),
    params:
        target=lambda wc: target_arg(wc.model),
        extra=lambda wc: args(config["models"][wc.model]["adapter"]["train_args"]),
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "python -m weaver.train adapter --target {params.target} --drafter {input.drafter} --out {output} "
        "--threads {threads} {params.extra} > {log} 2>&1"
