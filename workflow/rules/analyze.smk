# Raw logs -> tidy CSVs. The raw logs are ancient(): once a cell's meta.json exists, no timestamp (a fresh clone)
# and no missing checkpoint upstream can make Snakemake rerun a benchmark or a training job to rebuild the tables.


rule analyze:
    input:
        meta=[ancient(m) for m in META],
        kernels=[ancient(KERNEL_BENCH)] if KERNEL_BENCH else [],
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
