# The benchmark grid: one job per (model, dataset, method, budget, temperature) cell, meta.json as its marker.

def bench_inputs(wc):
    inputs = {"target": target_input(wc.model), "kernels": paths.KERNEL_BUILD.format(run=RUN)}
    if wc.method in DRAFTER_METHODS:
        inputs["drafter"] = checkpoint_input(wc.model, "drafter")
    if wc.method in ADAPTER_METHODS:
        inputs["adapter"] = checkpoint_input(wc.model, "adapter", wc.temperature)
    return inputs


def checkpoint_flags(wc):
    flags = []
    if wc.method in DRAFTER_METHODS:
        flags += ["--drafter", checkpoint_of(wc.model, "drafter")]
    if wc.method in ADAPTER_METHODS:
        adapter = checkpoint_of(wc.model, "adapter", wc.temperature)  # the one serving this cell's temperature
        flags += ["--adapter", adapter, "--children", config["weaver_children"]]
    return args(flags)


rule bench_cell:
    input:
        unpack(bench_inputs),
    output:
        paths.META,  # records.jsonl beside it is NOT an output: Snakemake would delete it and lose the resume
    log:
        log("bench", "{model}/{dataset}/{method}/b{budget}-t{temperature}"),
    params:
        target=lambda wc: target_arg(wc.model),
        n_prompts=lambda wc: config["datasets"][wc.dataset],
        checkpoints=checkpoint_flags,
        cell_dir=lambda wc, output: os.path.dirname(output[0]),
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "OMP_NUM_THREADS={threads} python -m weaver.bench --model {params.target} --model-name {wildcards.model} --dataset {wildcards.dataset} "
        "--method {wildcards.method} --budget {wildcards.budget} --temperature {wildcards.temperature} "
        "--n-prompts {params.n_prompts} --max-new-tokens {config[max_new_tokens]} --seed {config[seed]} "
        "--mode {config[verify_mode]} --backend {config[backend]} --threads {threads} {params.checkpoints} --out {params.cell_dir} > {log} 2>&1"
