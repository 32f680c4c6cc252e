# The CPU peers table (config key `peers`): every peer on the same prompts in one job per (model, dataset).

PEERS_RAW = paths.RUN + "/raw/peers/{model}/{dataset}.jsonl"
PEERS_ROWS = (
    [PEERS_RAW.format(run=RUN, model=m, dataset=d) for m in config["peers"]["models"] for d in config["peers"]["datasets"]]
    if "peers" in config
    else []
)
if PEERS_ROWS:
    ARTIFACT_EXTS["peers"] = ["md", "tex"]
    ARTIFACTS.extend(str(paths.figure_path(RUN, "peers", ext)) for ext in ARTIFACT_EXTS["peers"])


def peers_inputs(wc):
    needs = set(config["peers"]["peers"])
    inputs = {"target": target_input(wc.model)}
    if needs & {"dflash_reference", "chain", "ddtree", "weaver"}:
        inputs["drafter"] = checkpoint_input(wc.model, "drafter")
    if "weaver" in needs:
        inputs["adapter"] = checkpoint_input(wc.model, "adapter", "0")  # every peer decodes greedily
    return inputs


def peers_flags(wc, input):
    flags = ["--peers", ",".join(config["peers"]["peers"])]
    if "drafter" in input.keys():
        flags += ["--drafter", checkpoint_of(wc.model, "drafter")]
    if "adapter" in input.keys():
        flags += ["--adapter", checkpoint_of(wc.model, "adapter", "0"), "--children", config["weaver_children"]]
    return args(flags)


rule peers_run:
    input:
        unpack(peers_inputs),
    output:
        PEERS_RAW,
    log:
        log("peers", "{model}/{dataset}"),
    params:
        target=lambda wc: target_arg(wc.model),
        flags=peers_flags,
    threads: THREADS
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.peers --model {params.target} --model-name {wildcards.model} "
        "--dataset {wildcards.dataset} --n-prompts {config[peers][n_prompts]} --max-new-tokens {config[max_new_tokens]} "
        "--budget {config[peers][budget]} --seed {config[seed]} --threads {threads} {params.flags} --out {output} "
        "> {log} 2>&1"


if PEERS_ROWS:

    rule peers_table:
        input:
            rows=PEERS_ROWS,
        output:
            artifact("peers"),
        log:
            paths.LOG.format(run=RUN, rule="figures", job="peers"),
        script:
            "../scripts/peers_table.py"
