#!/usr/bin/env bash
# GPU check for weaver_kernels: build the CUDA extension, run the kernel tests on the GPU, run the kernel benchmark.
# Usage: kernels/gpu_check.sh [OUT_DIR]   (or WEAVER_GPU_CHECK_OUT=DIR; default results/kernels/<gpu name>)
# Budget: about 8 minutes on one GPU (build ~2-4 min, tests ~1 min, benchmark ~1 min).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' /' '__')
OUT=${1:-${WEAVER_GPU_CHECK_OUT:-results/kernels/${GPU}}}
mkdir -p "$OUT"
echo "== gpu: $GPU -> $OUT"
timeout 300 "$PYTHON" -m weaver_kernels.build --require 2>&1 | tee "$OUT/build.log"
status=0
# a failing test still lets the benchmark run; the script's exit status reports it
timeout 240 "$PYTHON" -m pytest -q tests/kernels -m "not slow" -rs 2>&1 | tee "$OUT/tests.log" || status=1
timeout 150 "$PYTHON" -m weaver_kernels.bench --device cuda --dtype bfloat16 --out "$OUT" 2>&1 | tee "$OUT/bench.log"
echo "== done: $OUT/kernel_table.csv (tests $([ $status = 0 ] && echo passed || echo FAILED))"
exit $status
