# Raw logs -> tidy CSVs. The raw logs are plain inputs, not ancient(): Snakemake 9 never reruns a job for an ancient
# input that exists, not even when the job producing it reruns in the same invocation, so ancient() here left the tables
# stale after a rerun of benchmark cells. A fresh clone (raw logs, no checkpoints) still runs no producing job: only
# this cheap job, when the raw logs happen to be newer than the tables (tests/test_workflow.py checks both).


rule analyze:
    input:
        meta=META,
        kernels=[KERNEL_BENCH] if KERNEL_BENCH else [],
    output:
        list(TIDY.values()),
    log:
        paths.LOG.format(run=RUN, rule="analyze", job="tidy"),
    params:
        kernels=lambda wc, input: f"--kernels {input.kernels}" if input.kernels else "",
        out=os.path.dirname(TIDY["cells"]),
        budget_free=args(["--budget-free", *BUDGET_FREE]) if BUDGET_FREE else "",
    shell:
        "python -m weaver.analyze --meta {input.meta} {params.kernels} {params.budget_free} --out {params.out} > {log} 2>&1"
