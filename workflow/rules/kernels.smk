# GDN tree kernels: build (CUDA extension where CUDA exists; a clear skip otherwise) and the kernel bench.


rule build_kernels:
    output:
        paths.KERNEL_BUILD,
    log:
        log("build_kernels", "build"),
    resources:
        gpu=GPUS,
    shell:
        "python -m weaver_kernels.build > {log} 2>&1 && "
        "python -c 'import json, sys; json.dump({{\"log\": sys.argv[2]}}, open(sys.argv[1], \"w\"))' {output} {log}"


rule kernel_bench:
    input:
        paths.KERNEL_BUILD,
    output:
        paths.KERNEL_BENCH,
    log:
        log("kernel_bench", "gdn_tree"),
    params:
        extra=lambda wc: args(config.get("kernel_bench", {}).get("args", [])),
    threads: THREADS
    resources:
        gpu=GPUS,
    shell:
        "python -m weaver_kernels.bench --out $(dirname {output}) {params.extra} > {log} 2>&1"
