#!/usr/bin/env bash
# GPU check for weaver_kernels: build the CUDA extension, run the kernel tests, the target's tree verify / commit
# (tests/test_model_tree.py: CUDA run == CPU run) and the engine (every method's greedy output on CUDA == plain
# decoding) on the GPU, run the kernel benchmark (GDN layouts, the Weaver step, a verify's tree attention against SDPA).
# Usage: kernels/gpu_check.sh [OUT_DIR]   (or WEAVER_GPU_CHECK_OUT=DIR; default results/kernels/<gpu name>)
# Writes OUT/gpu_check.log (machine, versions, build, tests, bench) and OUT/kernel_table.{csv,json}.
# Every stage runs even when an earlier one failed (a GPU lease is short); the exit status is 1 if any stage failed.
# Works from a plain checkout (no install): the repo root and kernels/ go on PYTHONPATH.
# Budget: at most 9.5 minutes on one GPU (stage limits: build 4 min, tests 3 min, benchmark 2.5 min); about 2.5
# minutes on an H200 (results/kernels/NVIDIA_H200).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
export PYTHONPATH="$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' /' '__')
OUT=${1:-${WEAVER_GPU_CHECK_OUT:-results/kernels/${GPU}}}
mkdir -p "$OUT"
failed=()
stage() {  # stage NAME SECONDS CMD...: run with a time limit, note a failure, go on
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    echo "== $name ($(date -u +%H:%M:%S))"
    timeout "$limit" "$@" || failed+=("$name (exit $?)")
    echo "== $name took $((SECONDS - t0)) s"
}
main() {
    echo "== gpu: $GPU -> $OUT"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$PYTHON" -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "triton", triton.__version__, "capability", torch.cuda.get_device_capability())'
    echo "commit ${WEAVER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo 'unknown (no git metadata; set WEAVER_COMMIT)')}"
    stage build 240 "$PYTHON" -m weaver_kernels.build --require
    backends=(triton)
    "$PYTHON" -c 'from weaver_kernels import cuda_ext; raise SystemExit(not cuda_ext.available())' && backends+=(cuda)
    stage tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels tests/test_model_tree.py \
        tests/test_engine.py::test_greedy_speculation_on_cuda_equals_plain_decoding -m "not slow" -rs
    stage bench 150 "$PYTHON" -m weaver_kernels.bench --device cuda --dtype bfloat16 --backend "${backends[@]}" \
        --layouts qwen3.6-27b qwen3-next-80b small-hybrid weaver-step tree-attention --timing graph eager --out "$OUT"
    if ((${#failed[@]})); then
        echo "== done: $OUT/kernel_table.csv; FAILED: ${failed[*]}"
        exit 1
    fi
    echo "== done: $OUT/kernel_table.csv (build, tests and bench passed)"
}
main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
