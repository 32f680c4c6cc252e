"""SGLang server commands per method (GPU only: SGLang's kernels need CUDA), following the authors' reproduction.

Versions (environment.yml, GPU block; config/paper.yaml `sglang`):
- `ar`, `chain`: upstream SGLang (PyPI `sglang==0.5.23`), `--speculative-algorithm DFLASH` for the chain;
- `weaver`: the authors' fork github.com/trymirai/sglang at commit FORK_COMMIT, `--speculative-algorithm DFLASH_TFM`.

The flags are the fork's `reproduction.sh` (`serve-ar`, `serve-dflash`, `serve-tfm`: B200, batch 1, bf16, page size
64, radix cache off) and the DFLASH_TFM options of the fork's `python/sglang/srt/server_args.py` at FORK_COMMIT:
- `--speculative-dflash-tfm-path`: the Weaver checkpoint, torch.save of {'config', 'state_dict'} loaded by the fork's
  `Weaver.load` (`Weaver(**config)`, strict state_dict); weaver.adapter.Weaver.save writes that format;
- `--speculative-dflash-tfm-tree-budget` (default 128): drafted nodes, root excluded; the target verifies budget + 1
  tokens. When budget + 1 <= the DFlash block size (16) the fork drafts a Weaver *chain* of budget + 1 tokens and
  verifies it as a chain (DFlashTfmWorker.use_chain_verify), not a tree;
- `--speculative-dflash-tfm-tree-sampling-mode` in {target_only, traversal} (default target_only; `serve-tfm` leaves
  the default), the verifier at temperature > 0;
- `--speculative-dflash-tfm-candidate-pool-size` (default: the checkpoint's `candidate_pool_size`; the fork uses
  min(requested, checkpoint's));
- `--speculative-gdn-verify-kernel` in {recurrent, chunk} (default recurrent; `serve-tfm` passes chunk; only GDN /
  hybrid-linear targets read it), and `--disable-overlap-schedule`.
The DFlash block size of DFLASH_TFM is not passed: the fork infers it from the drafter's config (16 if absent).
The fork at FORK_COMMIT has no DDTree proposal (no `--speculative-dflash-tfm-proposal` in its server_args), so
`ddtree` runs on the engine backend only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

UPSTREAM_VERSION = "0.5.23"
FORK_REPO = "https://github.com/trymirai/sglang"
FORK_COMMIT = "aeac03f0d4c8789559411be95c5c127bdff24d1c"
SGLANG_METHODS = ("ar", "chain", "weaver")
DFLASH_BLOCK_SIZE = 16  # the paper's drafters: 15 drafts + the root
TREE_SAMPLING_MODES = ("target_only", "traversal")  # choices of --speculative-dflash-tfm-tree-sampling-mode
GDN_VERIFY_KERNEL = "chunk"  # reproduction.sh serve-tfm; the fork's choices are recurrent (default) and chunk
NO_SGLANG_CONFIGURATION = {
    "ddtree": (
        f"the fork at {FORK_COMMIT[:7]} offers DFLASH_TFM with the Weaver proposal only (its server_args has no "
        "--speculative-dflash-tfm-proposal; the DDTree proposal, `--speculative-dflash-tfm-proposal ddtree`, "
        "exists only in other fork commits such as 02700ca)"
    ),
    "weaver_chain": (
        "the fork's DFLASH_TFM drafts a Weaver chain only when tree budget + 1 <= block size, and then samples its "
        "proposals at temperature > 0 instead of taking our greedy chain"
    ),
    "prompt_lookup": "SGLang's NGRAM algorithm (an n-gram trie cache) is a different proposer from our prompt lookup",
}


@dataclass(frozen=True)
class SglangLaunch:
    """One SGLang server configuration."""

    model: str  # target: HF repo id or local folder
    method: str  # ar | chain | weaver
    port: int
    budget: int = 0  # weaver: tree budget (drafted nodes, root excluded)
    drafter: str | None = None  # DFlash drafter folder or repo id (chain, weaver)
    adapter: str | None = None  # Weaver checkpoint (.pt / .pth) (weaver)
    mode: str = "target_only"  # weaver: tree sampling mode (TREE_SAMPLING_MODES)
    candidate_pool_size: int | None = None  # weaver: top-K pool; None = the checkpoint's
    host: str = "127.0.0.1"
    python: str = sys.executable
    revision: str | None = None  # target revision when `model` is a repo id (reproduction.sh pins one)
    drafter_revision: str | None = None  # drafter revision when `drafter` is a repo id


def common_flags(launch: SglangLaunch) -> list[str]:
    revision = ["--revision", launch.revision] if launch.revision else []
    return [
        *("--model-path", launch.model, *revision, "--dtype", "bfloat16", "--tp-size", "1"),
        *("--max-running-requests", "1", "--cuda-graph-max-bs", "32", "--mem-fraction-static", "0.75"),
        *("--page-size", "64", "--disable-radix-cache", "--host", launch.host, "--port", str(launch.port)),
    ]


def sglang_command(launch: SglangLaunch) -> list[str]:
    """`python -m sglang.launch_server ...` for `launch.method`; refuses what SGLang cannot run."""
    if launch.method not in SGLANG_METHODS:
        why = NO_SGLANG_CONFIGURATION.get(launch.method, "no SGLang algorithm implements it")
        raise ValueError(
            f"method {launch.method!r} has no SGLang configuration (available: {', '.join(SGLANG_METHODS)}): "
            f"{why}; run it on the engine backend (--backend engine)"
        )
    cmd = [launch.python, "-m", "sglang.launch_server", *common_flags(launch)]
    if launch.method == "ar":
        return cmd + ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "flashinfer"]
    if not launch.drafter:
        raise ValueError(f"SGLang method {launch.method!r} needs a DFlash drafter: give --drafter DIR")
    draft = ["--speculative-draft-attention-backend", "fa4", "--speculative-draft-model-path", launch.drafter]
    if launch.drafter_revision:
        draft += ["--speculative-draft-model-revision", launch.drafter_revision]
    if launch.method == "chain":  # serve-dflash: one attention backend for decode and prefill
        block = str(DFLASH_BLOCK_SIZE)
        return cmd + [
            *("--attention-backend", "trtllm_mha", "--speculative-algorithm", "DFLASH", *draft),
            *("--speculative-dflash-block-size", block, "--speculative-num-draft-tokens", block),
        ]
    if not launch.adapter or launch.budget < 1:
        raise ValueError("SGLang method 'weaver' needs --adapter CHECKPOINT and --budget >= 1")
    if launch.mode not in TREE_SAMPLING_MODES:
        raise ValueError(
            f"the fork's --speculative-dflash-tfm-tree-sampling-mode takes {' or '.join(TREE_SAMPLING_MODES)}, "
            f"got {launch.mode!r}"
        )
    if launch.candidate_pool_size is not None and launch.candidate_pool_size < 1:
        raise ValueError(f"candidate_pool_size must be positive, got {launch.candidate_pool_size}")
    cmd += ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "flashinfer"]
    cmd += [*draft, "--speculative-algorithm", "DFLASH_TFM", "--speculative-dflash-tfm-path", launch.adapter]
    cmd += ["--speculative-dflash-tfm-tree-budget", str(launch.budget)]
    cmd += ["--speculative-dflash-tfm-tree-sampling-mode", launch.mode]
    if launch.candidate_pool_size is not None:
        cmd += ["--speculative-dflash-tfm-candidate-pool-size", str(launch.candidate_pool_size)]
    return cmd + ["--speculative-gdn-verify-kernel", GDN_VERIFY_KERNEL, "--disable-overlap-schedule"]
