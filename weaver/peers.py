"""Peers side by side on CPU: one run, the same prompts, the same machine, the same target weights.

    python -m weaver.peers --model smollm2-135m --dataset mt_bench --n-prompts 4 --max-new-tokens 64 --budget 16 \
        --drafter DIR --adapter FILE --out peers.jsonl

Peers (one JSON line per peer and prompt: new_tokens, steps, tau, wall_s, tokens_per_s):
- `transformers_ar`: transformers' `generate`, greedy;
- `transformers_prompt_lookup`: transformers' `generate(prompt_lookup_num_tokens=...)`;
- `dflash_reference`: the `dflash` package's (z-lab, PyPI) reference loop `dflash_generate` driving OUR drafter,
  loaded from its z-lab-format folder by `dflash.DFlashDraftModel`, on transformers' target. The loop only calls the
  target's Hugging Face forward (any family with hidden states: SmolLM2's llama works) and needs a Qwen3-style
  drafter, which is ours; its timer calls torch.cuda.synchronize, so on CPU it is swapped for time.perf_counter;
- ours (`weaver.generate`): ar, prompt_lookup, chain, ddtree, weaver at `--budget`.
Steps count target forwards with the prefill as one (weaver.generate), so AR has tau = 1 everywhere; transformers'
steps are counted with a forward hook. Greedy decoding: every peer must produce the same tokens (checked).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weaver.bench import PAPER_CHILDREN

HF_PEERS = ("transformers_ar", "transformers_prompt_lookup")
OUR_PEERS = ("ar", "prompt_lookup", "chain", "ddtree", "weaver")
PEERS = (*HF_PEERS, "dflash_reference", *OUR_PEERS)
DRAFTER_PEERS = ("dflash_reference", "chain", "ddtree", "weaver")


@dataclass(frozen=True)
class PeerRun:
    """One peer on one prompt."""

    output_ids: list[int]
    steps: int  # target forwards, prefill included
    wall_s: float  # including prefill

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)


class ForwardCounter:
    """Counts forward calls of a module (transformers' target forwards) inside a `with` block."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls = module, 0

    def __enter__(self) -> ForwardCounter:
        self.handle = self.module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


@torch.inference_mode()
def run_transformers(hf_model: Any, ids: list[int], max_new: int, eos: int | None, lookup: int = 0) -> PeerRun:
    """transformers' greedy `generate`, plain or with prompt lookup (`lookup` = prompt_lookup_num_tokens)."""
    prompt = torch.tensor([ids])
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    with ForwardCounter(hf_model) as counter:
        start = time.perf_counter()
        out = hf_model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
            **extra,
        )
        wall = time.perf_counter() - start
    return PeerRun(out[0, len(ids) :].tolist(), counter.calls, wall)


def load_dflash_drafter(path: str | Path) -> Any:
    """Our drafter folder (weaver.drafter.save_drafter, z-lab format) loaded by the dflash package itself."""
    from dflash import DFlashDraftModel

    return DFlashDraftModel.from_pretrained(str(path), torch_dtype=torch.float32).eval()


def run_dflash_reference(
    dflash_model: Any, hf_model: Any, ids: list[int], max_new: int, eos: int | None, block_size: int | None = None
) -> PeerRun:
    """z-lab's `dflash_generate` (greedy): block drafts verified as a chain; steps = prefill + its verify rounds."""
    import dflash.model

    dflash.model._cuda_time = time.perf_counter  # its timer synchronises CUDA; a CPU run has nothing to sync
    start = time.perf_counter()
    stats = dflash.model.dflash_generate(
        dflash_model,
        hf_model,
        torch.tensor([ids]),
        max_new,
        [eos] if eos is not None else None,
        block_size=block_size,
        return_stats=True,
    )
    wall = time.perf_counter() - start
    output = stats.output_ids[0, len(ids) :].tolist()
    return PeerRun(output, 1 + len(stats.acceptance_lengths), wall)


def run_ours(engine: Any, ids: list[int], max_new: int) -> PeerRun:
    result = engine.generate(ids, max_new_tokens=max_new)
    return PeerRun(result.output_ids, result.stats.steps, result.stats.wall_s)


Runner = Callable[[list[int], int], PeerRun]  # (prompt ids, max_new_tokens) -> PeerRun


def make_runners(args: argparse.Namespace, model: Any, tokenizer: Any) -> dict[str, Runner]:
    """peer name -> run(prompt_ids, max_new_tokens) for the requested peers; each model is loaded once."""
    from weaver.backends.engine import Engine, EngineConfig
    from weaver.models import load_hf_reference

    eos = tokenizer.eos_token_id
    runners: dict[str, Runner] = {}
    hf_model = load_hf_reference(args.model) if set(args.peers) & {*HF_PEERS, "dflash_reference"} else None
    if "transformers_ar" in args.peers:
        runners["transformers_ar"] = lambda ids, n: run_transformers(hf_model, ids, n, eos)
    if "transformers_prompt_lookup" in args.peers:
        lookup = args.lookup_tokens
        runners["transformers_prompt_lookup"] = lambda ids, n: run_transformers(hf_model, ids, n, eos, lookup)
    if "dflash_reference" in args.peers:
        dflash_model = load_dflash_drafter(args.drafter)
        runners["dflash_reference"] = lambda ids, n: run_dflash_reference(dflash_model, hf_model, ids, n, eos)
    for method in (p for p in OUR_PEERS if p in args.peers):
        budget = 0 if method == "ar" else args.budget
        config = EngineConfig(args.model, method, budget, args.drafter, args.adapter, children=args.children)
        engine = Engine(config, model, tokenizer)
        runners[method] = lambda ids, n, engine=engine: run_ours(engine, ids, n)
    return runners


def peer_rows(
    runners: dict[str, Runner], prompts: Sequence[tuple[str, list[int]]], max_new: int, meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """Run every peer on every prompt (interleaved per prompt, so all see the same machine state); one row each.

    `same_output` compares each peer's tokens with the first peer's: greedy decoding is lossless, so a False flags
    a broken peer (or a numerical near-tie between transformers and our kernels, visible in the row).
    """
    rows = []
    for prompt_id, ids in prompts:
        reference = None
        for name, run in runners.items():
            result = run(ids, max_new)
            reference = result.output_ids if reference is None else reference
            rows.append(
                {
                    **meta,
                    "peer": name,
                    "prompt_id": prompt_id,
                    "new_tokens": result.new_tokens,
                    "steps": result.steps,
                    "tau": result.new_tokens / max(result.steps, 1),
                    "wall_s": result.wall_s,
                    "tokens_per_s": result.new_tokens / result.wall_s,
                    "same_output": result.output_ids == reference,
                }
            )
            print(
                f"[{name}] {prompt_id}: tau {rows[-1]['tau']:.2f}, {rows[-1]['tokens_per_s']:.1f} tok/s",
                file=sys.stderr,
            )
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m weaver.peers", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="target: a registry name or a local Hugging Face folder")
    p.add_argument("--model-name", default=None, help="name in the rows (default: basename of --model)")
    p.add_argument("--dataset", required=True, help="dataset registry name (weaver.data.DATASETS)")
    p.add_argument("--n-prompts", type=int, default=4, help="prompts drawn from the dataset with --seed")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt draw")
    p.add_argument("--max-new-tokens", type=int, default=64, help="upper bound on generated tokens per prompt")
    p.add_argument("--budget", type=int, default=16, help="tree budget of our speculative peers (the CPU-best)")
    p.add_argument("--lookup-tokens", type=int, default=10, help="transformers' prompt_lookup_num_tokens")
    p.add_argument("--drafter", default=None, help="drafter folder (dflash_reference, chain, ddtree, weaver)")
    p.add_argument("--adapter", default=None, help="Weaver adapter checkpoint (weaver)")
    p.add_argument(
        "--children",
        type=int,
        default=PAPER_CHILDREN,
        help=f"weaver builder's fan-out per expanded node (paper: {PAPER_CHILDREN})",
    )
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated subset of {', '.join(PEERS)}")
    p.add_argument("--warmup-tokens", type=int, default=8, help="untimed warm-up generation per peer (0 = none)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", required=True, help="JSONL file of rows (written atomically at the end)")
    args = p.parse_args(argv)
    args.peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    unknown = sorted(set(args.peers) - set(PEERS))
    if unknown:
        p.error(f"unknown peers {unknown}; choose from {', '.join(PEERS)}")
    if set(args.peers) & set(DRAFTER_PEERS) and not args.drafter:
        p.error(f"peers {sorted(set(args.peers) & set(DRAFTER_PEERS))} need --drafter DIR")
    if "weaver" in args.peers and not args.adapter:
        p.error("peer weaver needs --adapter CHECKPOINT")
    for flag in ("n_prompts", "max_new_tokens", "budget", "lookup_tokens", "children"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.warmup_tokens < 0:
        p.error(f"--warmup-tokens must be >= 0 (0 = no warm-up), got {args.warmup_tokens}")
    from weaver.data import DATASETS

    if args.dataset not in DATASETS:
        p.error(f"unknown --dataset {args.dataset!r}; choose from {', '.join(DATASETS.names())}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from weaver.bench import write_atomic
    from weaver.data import format_prompt, load_prompts
    from weaver.models import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.model)
    drawn = load_prompts(args.dataset, n=args.n_prompts, seed=args.seed)
    prompts = [(p.prompt_id, format_prompt(tokenizer, p)) for p in drawn]
    runners = make_runners(args, model, tokenizer)
    if args.warmup_tokens:  # first calls pay for allocator growth and lazy initialisation
        for run in runners.values():
            run(prompts[0][1], args.warmup_tokens)
    meta = {
        "model": args.model_name or Path(args.model.rstrip("/")).name,
        "dataset": args.dataset,
        "budget": args.budget,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
    }
    rows = peer_rows(runners, prompts, args.max_new_tokens, meta)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(args.out), "".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
