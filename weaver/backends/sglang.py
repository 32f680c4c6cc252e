"""SGLang server commands per method (GPU only: SGLang's kernels need CUDA), following the authors' reproduction.

Versions (environment.yml, GPU block; config/paper.yaml `sglang`):
- `ar`, `chain`: upstream SGLang (PyPI `sglang==0.5.23`), `--speculative-algorithm DFLASH` for the chain;
- `weaver`: the authors' fork github.com/trymirai/sglang at commit FORK_COMMIT, `--speculative-algorithm DFLASH_TFM`;
- `ddtree`: the fork at FORK_DDTREE_COMMIT, DFLASH_TFM with `--speculative-dflash-tfm-proposal ddtree`.

The flags are the fork's `reproduction.sh` (`serve-ar`, `serve-dflash`, `serve-tfm`, and `serve-ddtree` at 02700ca:
B200, batch 1, bf16, page size 64, radix cache off) and the DFLASH_TFM options of the fork's
`python/sglang/srt/server_args.py` at FORK_COMMIT:
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

DDTree (`ddtree`): FORK_COMMIT has no `--speculative-dflash-tfm-proposal`; other fork commits have it
(server_args at 02700cab56df67cccba8ca0657d4d60430bb9b03: choices weaver, ddtree, default weaver; `serve-ddtree` there
is `serve-tfm` plus `--speculative-dflash-tfm-proposal ddtree`, without `--speculative-dflash-tfm-path`). Its
DFlashTfmWorker (python/sglang/srt/speculative/dflash_tfm.py) loads no Weaver, takes the draft top-k equal to the
budget, refuses `--speculative-dflash-tfm-candidate-pool-size`, any sampling mode but target_only, block sizes outside
2..16, chain verification (budget + 1 <= block size), and budgets above its cap: 64 at 02700ca, DDTREE_MAX_BUDGET = 128
at FORK_DDTREE_COMMIT (also the cap of its Triton builder, speculative/ddtree.py). sglang_command checks all of that
up front; check_sglang_build asks the installed SGLang (`launch_server --help`) for the proposal flag before a launch.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

UPSTREAM_VERSION = "0.5.23"
FORK_REPO = "https://github.com/trymirai/sglang"
FORK_COMMIT = "aeac03f0d4c8789559411be95c5c127bdff24d1c"
FORK_DDTREE_COMMIT = "b1d4b71ed0e2b2c523949a951cde21f5d380d6f0"  # has --speculative-dflash-tfm-proposal ddtree
SGLANG_METHODS = ("ar", "chain", "ddtree", "weaver")
DFLASH_BLOCK_SIZE = 16  # the paper's drafters: 15 drafts + the root
TREE_SAMPLING_MODES = ("target_only", "traversal")  # choices of --speculative-dflash-tfm-tree-sampling-mode
GDN_VERIFY_KERNEL = "chunk"  # reproduction.sh serve-tfm; the fork's choices are recurrent (default) and chunk
DDTREE_FLAG = "--speculative-dflash-tfm-proposal"  # choices weaver (default), ddtree
DDTREE_MAX_BUDGET = 128  # the fork's DDTree cap at FORK_DDTREE_COMMIT (64 at 02700ca)
DDTREE_MIN_BUDGET = DFLASH_BLOCK_SIZE  # budget + 1 verify tokens must exceed the block size (no chain verify)
NO_SGLANG_CONFIGURATION = {
    "weaver_chain": (
        "the fork's DFLASH_TFM drafts a Weaver chain only when tree budget + 1 <= block size, and then samples its "
        "proposals at temperature > 0 instead of taking our greedy chain"
    ),
    "prompt_lookup": "SGLang's NGRAM algorithm (an n-gram trie cache) is a different proposer from our prompt lookup",
}


class SglangBuildError(RuntimeError):
    """The installed SGLang lacks what the method needs (a different build than the pinned one)."""


@dataclass(frozen=True)
class SglangLaunch:
    """One SGLang server configuration."""

    model: str  # target: HF repo id or local folder
    method: str  # ar | chain | ddtree | weaver
    port: int
    budget: int = 0  # ddtree, weaver: tree budget (drafted nodes, root excluded)
    drafter: str | None = None  # DFlash drafter folder or repo id (chain, ddtree, weaver)
    adapter: str | None = None  # Weaver checkpoint (.pt / .pth) (weaver; ddtree ignores it)
    mode: str = "target_only"  # weaver: tree sampling mode (TREE_SAMPLING_MODES); ddtree: target_only only
    candidate_pool_size: int | None = None  # weaver: top-K pool; None = the checkpoint's (ddtree: must stay None)
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


def _check_weaver(launch: SglangLaunch) -> None:
    if not launch.adapter or launch.budget < 1:
        raise ValueError("SGLang method 'weaver' needs --adapter CHECKPOINT and --budget >= 1")
    if launch.mode not in TREE_SAMPLING_MODES:
        raise ValueError(
            f"the fork's --speculative-dflash-tfm-tree-sampling-mode takes {' or '.join(TREE_SAMPLING_MODES)}, "
            f"got {launch.mode!r}"
        )
    if launch.candidate_pool_size is not None and launch.candidate_pool_size < 1:
        raise ValueError(f"candidate_pool_size must be positive, got {launch.candidate_pool_size}")


def _check_ddtree(launch: SglangLaunch) -> None:
    """What the fork's DDTree worker refuses at start-up, refused here before anything is launched."""
    fork = f"the fork's DDTree proposal (trymirai/sglang {FORK_DDTREE_COMMIT[:7]})"
    if not DDTREE_MIN_BUDGET <= launch.budget <= DDTREE_MAX_BUDGET:
        raise ValueError(
            f"{fork} takes --budget {DDTREE_MIN_BUDGET}..{DDTREE_MAX_BUDGET}, got {launch.budget}: its builder and "
            f"worker cap the budget at {DDTREE_MAX_BUDGET} non-root nodes (64 at 02700ca), and it refuses chain "
            f"verification, so budget + 1 verify tokens must exceed the DFlash block size ({DFLASH_BLOCK_SIZE}); "
            "run other budgets on the engine backend (--backend engine)"
        )
    if launch.mode != "target_only":
        raise ValueError(f"{fork} verifies with target_only only (deterministic tree), got mode {launch.mode!r}")
    if launch.candidate_pool_size is not None:
        raise ValueError(f"{fork} takes its top-k equal to the budget; it refuses a candidate pool size")


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
    if launch.method == "ddtree":  # serve-ddtree: serve-tfm with the DDTree proposal, no Weaver checkpoint
        _check_ddtree(launch)
        proposal = [DDTREE_FLAG, "ddtree"]
    else:
        _check_weaver(launch)
        proposal = ["--speculative-dflash-tfm-path", launch.adapter]
    cmd += ["--decode-attention-backend", "trtllm_mha", "--prefill-attention-backend", "flashinfer"]
    cmd += [*draft, "--speculative-algorithm", "DFLASH_TFM", *proposal]
    cmd += ["--speculative-dflash-tfm-tree-budget", str(launch.budget)]
    cmd += ["--speculative-dflash-tfm-tree-sampling-mode", launch.mode]
    if launch.candidate_pool_size is not None:
        cmd += ["--speculative-dflash-tfm-candidate-pool-size", str(launch.candidate_pool_size)]
    return cmd + ["--speculative-gdn-verify-kernel", GDN_VERIFY_KERNEL, "--disable-overlap-schedule"]


@functools.cache
def sglang_help(python: str, timeout_s: float = 600.0) -> str:
    """`PYTHON -m sglang.launch_server --help` of the SGLang installed for `python` (run once per interpreter)."""
    command = [python, "-m", "sglang.launch_server", "--help"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SglangBuildError(f"`{' '.join(command)}` failed: {e}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-800:]
        raise SglangBuildError(f"`{' '.join(command)}` exited with {done.returncode}: {tail}")
    return done.stdout


def _offers_ddtree(help_text: str) -> bool:
    """Whether `launch_server --help` lists DDTREE_FLAG with `ddtree` among its choices (argparse: `{a,b}`)."""
    match = re.search(re.escape(DDTREE_FLAG) + r"(?![\w-])(?:[ =]\{([^}]*)\})?", help_text)
    return match is not None and (match.group(1) is None or "ddtree" in match.group(1).split(","))


def check_sglang_build(launch: SglangLaunch, help_text: Callable[[str], str] = sglang_help) -> None:
    """Before a launch: the installed SGLang offers what `launch.method` needs; ddtree needs the fork's proposal flag.

    `help_text(python)` is the `launch_server --help` output of that interpreter's SGLang (sglang_help).
    """
    if launch.method != "ddtree":
        return
    install = f"git clone {FORK_REPO} && cd sglang && git checkout {FORK_DDTREE_COMMIT} && pip install -e 'python[all]'"
    try:
        text = help_text(launch.python)
    except SglangBuildError as e:
        raise SglangBuildError(
            f"method 'ddtree' needs SGLang's {DDTREE_FLAG} ddtree, but asking {launch.python}'s SGLang failed ({e}); "
            f"install the authors' fork at {FORK_DDTREE_COMMIT}: {install}"
        ) from None
    if not _offers_ddtree(text):
        raise SglangBuildError(
            f"the SGLang installed for {launch.python} does not accept {DDTREE_FLAG} ddtree (not in its "
            f"`launch_server --help`), which method 'ddtree' needs: upstream SGLang and the fork at "
            f"{FORK_COMMIT[:7]} have no DDTree proposal; install the authors' fork at {FORK_DDTREE_COMMIT}: {install}"
        )
