"""SGLang server commands per method (GPU only: SGLang's kernels need CUDA), following the authors' reproduction.

Versions (environment.yml, GPU block; config/paper.yaml `sglang`):
- `ar`, `chain`: upstream SGLang (PyPI `sglang==0.5.23`), `--speculative-algorithm DFLASH` for the chain;
- `weaver`: the authors' fork github.com/trymirai/sglang at commit FORK_COMMIT, `--speculative-algorithm DFLASH_TFM`
  with `--speculative-dflash-tfm-path` (our adapter.pt: weaver.adapter.Weaver.save writes the fork's format),
  `--speculative-dflash-tfm-tree-budget`, `--speculative-dflash-tfm-tree-sampling-mode`,
  `--speculative-dflash-tfm-candidate-pool-size` (server_args names read from the fork's DFLASH_TFM worker).
Flags common to every method are those of the fork's README (B200, batch 1, bf16, page size 64, radix cache off).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

UPSTREAM_VERSION = "0.5.23"
FORK_REPO = "https://github.com/trymirai/sglang"
FORK_COMMIT = "aeac03f0d4c8789559411be95c5c127bdff24d1c"
SGLANG_METHODS = ("ar", "chain", "weaver")
DFLASH_BLOCK_SIZE = 16  # the paper's drafters: 15 drafts + the root


@dataclass(frozen=True)
class SglangLaunch:
    """One SGLang server configuration."""

    model: str  # target: HF repo id or local folder
    method: str  # ar | chain | weaver
    port: int
    budget: int = 0  # weaver: tree budget (drafted nodes, root excluded)
    drafter: str | None = None  # DFlash drafter folder (chain, weaver)
    adapter: str | None = None  # Weaver checkpoint (.pt) (weaver)
    mode: str = "target_only"  # weaver: tree sampling mode
    candidate_pool_size: int | None = None  # weaver: top-K pool; None = the checkpoint's
    host: str = "127.0.0.1"
    python: str = sys.executable


def common_flags(launch: SglangLaunch) -> list[str]:
    return [
        *("--model-path", launch.model, "--dtype", "bfloat16", "--tp-size", "1", "--max-running-requests", "1"),
        *("--cuda-graph-max-bs", "32", "--mem-fraction-static", "0.75", "--page-size", "64", "--disable-radix-cache"),
        *("--host", launch.host, "--port", str(launch.port)),
    ]


def sglang_command(launch: SglangLaunch) -> list[str]:
    """`python -m sglang.launch_server ...` for `launch.method`; refuses what SGLang cannot run."""
    if launch.method not in SGLANG_METHODS:
        raise ValueError(
            f"method {launch.method!r} has no SGLang configuration (available: {', '.join(SGLANG_METHODS)}); "
            "ddtree, prompt_lookup and weaver_chain run on the engine backend (--backend engine)"
        )
    cmd = [launch.python, "-m", "sglang.launch_server", *common_flags(launch)]
    if launch.method == "ar":
        return cmd + ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "flashinfer"]
    if not launch.drafter:
        raise ValueError(f"SGLang method {launch.method!r} needs a DFlash drafter: give --drafter DIR")
    draft = ["--speculative-draft-model-path", launch.drafter, "--speculative-draft-attention-backend", "fa4"]
    if launch.method == "chain":  # the README's tuned chain: one attention backend for decode and prefill
        block = str(DFLASH_BLOCK_SIZE)
        return cmd + [
            *("--attention-backend", "trtllm_mha", "--speculative-algorithm", "DFLASH", *draft),
            *("--speculative-dflash-block-size", block, "--speculative-num-draft-tokens", block),
        ]
    if not launch.adapter or launch.budget < 1:
        raise ValueError("SGLang method 'weaver' needs --adapter CHECKPOINT and --budget >= 1")
    cmd += ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "flashinfer"]
    cmd += ["--speculative-algorithm", "DFLASH_TFM", *draft, "--speculative-dflash-tfm-path", launch.adapter]
    cmd += ["--speculative-dflash-tfm-tree-budget", str(launch.budget)]
    cmd += ["--speculative-dflash-tfm-tree-sampling-mode", launch.mode]
    if launch.candidate_pool_size is not None:
        cmd += ["--speculative-dflash-tfm-candidate-pool-size", str(launch.candidate_pool_size)]
    return cmd + ["--speculative-gdn-verify-kernel", "chunk", "--disable-overlap-schedule"]
