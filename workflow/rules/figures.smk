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


rule tau_vs_budget:
    input:
        macro=TIDY["macro"],
    output:
        artifact("tau_vs_budget"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="tau_vs_budget"),
    script:
        "../scripts/tau_vs_budget.py"


rule depth_acceptance:
    input:
        depth=TIDY["depth_acceptance"],
    output:
        artifact("depth_acceptance"),
    params:
        methods=config["figures"]["depth_methods"],
        budget=config["figures"]["headline_budget"],
    log:
        paths.LOG.format(run=RUN, rule="figures", job="depth_acceptance"),
    script:
        "../scripts/depth_acceptance.py"


rule speedup_vs_budget:
    input:
        macro=TIDY["macro"],
    output:
        artifact("speedup_vs_budget"),
    log:
        paths.LOG.format(run=RUN, rule="figures", job="speedup_vs_budget"),
    script:
        "../scripts/speedup_vs_budget.py"


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
