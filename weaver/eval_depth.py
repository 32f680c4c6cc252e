"""Per-depth acceptance of a drafter's marginals, teacher-forced (the paper's Figure 4, METHOD.md section 2).

`python -m weaver.eval_depth --model M --drafter D [--adapter A] --dataset mt_bench humaneval --out depth.csv`

Held-out prompts are continued by the target itself (greedy at temperature 0, sampled at temperature > 0); at anchors
L in that continuation the drafter drafts depths d = 1..D from the context x_<L, and each depth is scored against the
target's conditional p(. | x_<L+d) with the ground-truth continuation as prefix:

    argmax          p(argmax q_d)                     a Dirac delta at the marginal's mode (what a chain drafts)
    sample          sum_x q_d(x) p(x)                 a draft sampled from the marginal (exact expectation)
    weaver_argmax   p(argmax w_d)                     Weaver's greedy chain, w_d its pool softmax on the true path
    weaver_sample   sum_{c in pool} w_d(c) p(c)       a draft sampled from Weaver's pool distribution

p is the target after temperature (one-hot on its argmax at temperature 0). These are the acceptance probabilities of
one draft at depth d given that depths < d were accepted; the paper's observation is that `argmax` beats `sample`
from depth 2-4 on, even at temperature 1, and Weaver's path-conditioned drafts stay above both.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weaver.adapter import Weaver, candidate_pools
from weaver.sampling import SamplingParams, target_probs
from weaver.training.adapter import draft_at_anchors, teacher_forced_logits
from weaver.training.features import regenerate

DRAFTS = ("argmax", "sample", "weaver_argmax", "weaver_sample")
FIELDS = ("model", "dataset", "temperature", "depth", "draft", "acceptance", "n")


@dataclass(frozen=True)
class DepthRow:
    """Mean acceptance of one draft kind at one depth over n (anchor, depth) pairs."""

    model: str
    dataset: str
    temperature: float
    depth: int
    draft: str
    acceptance: float
    n: int


@torch.no_grad()
def sequence_acceptance(
    model: Any,
    drafter: Any,
    adapter: Weaver | None,
    ids: torch.Tensor,
    anchors: Sequence[int],
    temperature: float,
) -> dict[str, torch.Tensor]:
    """Per-anchor, per-depth acceptance of each draft kind on one sequence ids [T].

    Returns {draft: [A, D] acceptance} plus "valid" [A, D] (the target's conditional at L + d - 1 exists: L + d <= T).
    """
    out = model(ids[None], cache=None, hidden_layers=drafter.hidden_layers)
    example = {"ids": ids, "hidden": out.hidden[0]}
    embed, lm_head = model.embed_tokens.weight.float(), model.lm_head.weight.float()
    logits, proposal, target_hidden = draft_at_anchors(drafter, example, list(anchors), embed, lm_head)
    depth = logits.shape[1]
    # depth d (index d - 1) is scored by the target's conditional at position L + d - 1
    pos = torch.tensor(anchors)[:, None] + torch.arange(depth)
    valid = pos < ids.numel()
    pos = pos.clamp(max=ids.numel() - 1)
    p = target_probs(out.logits[0].float(), SamplingParams(temperature=temperature))[pos].float()  # [A, D, V]
    q = torch.softmax(logits.float(), dim=-1)
    result = {
        "argmax": p.gather(-1, q.argmax(-1, keepdim=True))[..., 0],
        "sample": (q * p).sum(-1),
        "valid": valid,
    }
    if adapter is not None:
        pools = candidate_pools(logits, adapter.config.candidate_pool_size)
        w_logits = teacher_forced_logits(adapter, target_hidden, proposal, ids[pos], pools, embed, lm_head)
        w = torch.softmax(w_logits.float(), dim=-1)
        p_pool = p.gather(-1, pools.ids.long())
        result["weaver_argmax"] = p_pool.gather(-1, w.argmax(-1, keepdim=True))[..., 0]
        result["weaver_sample"] = (w * p_pool).sum(-1)
    return result


def pick_anchors(prompt_len: int, length: int, count: int, generator: torch.Generator) -> list[int]:
    """Up to `count` sorted anchors L with the root x_L in [prompt_len - 1, length - 2] (drafts in the continuation)."""
    low, high = max(1, prompt_len - 1), length - 2
    if high < low:
        return []
    choice = torch.randperm(high - low + 1, generator=generator)[:count] + low
    return sorted(choice.tolist())


def evaluate(
    model: Any,
    drafter: Any,
    adapter: Weaver | None,
    prompts: Sequence[Sequence[int]],
    temperature: float,
    max_new_tokens: int,
    anchors_per_seq: int,
    eos_id: int | None,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Mean acceptance [D] and counts [D] per draft kind over the target's continuations of `prompts`."""
    sequences = regenerate(model, prompts, max_new_tokens, [temperature], eos_id, batch_size=8, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros(drafter.cfg.block_size - 1, dtype=torch.float64))
    count = torch.zeros(drafter.cfg.block_size - 1, dtype=torch.float64)
    for seq in sequences:
        anchors = pick_anchors(seq.prompt_len, len(seq.ids), anchors_per_seq, gen)
        if not anchors:
            continue
        acc = sequence_acceptance(model, drafter, adapter, torch.tensor(seq.ids), anchors, temperature)
        valid = acc.pop("valid").double()
        count += valid.sum(0)
        for name, value in acc.items():
            sums[name] += (value.double() * valid).sum(0)
    if not count.any():
        raise ValueError("no anchor had a continuation to score: raise --max-new-tokens or use longer prompts")
    return {name: total / count.clamp_min(1) for name, total in sums.items()} | {"n": count}


def rows_for(model_name: str, dataset: str, temperature: float, result: dict[str, torch.Tensor]) -> list[DepthRow]:
    """CSV rows (depth 1..D) of one evaluate() result; depths without any scored anchor are left out."""
    counts = result["n"]
    return [
        DepthRow(model_name, dataset, temperature, d + 1, name, float(result[name][d]), int(counts[d]))
        for name in DRAFTS
        if name in result
        for d in range(counts.numel())
        if counts[d] > 0
    ]


def write_csv(path: str | Path, rows: Sequence[DepthRow]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        writer.writerows([getattr(r, k) for k in FIELDS] for r in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m weaver.eval_depth", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="target: registry name or local folder")
    parser.add_argument("--model-name", default=None, help="name in the CSV (default: the basename of --model)")
    parser.add_argument("--drafter", required=True, help="drafter folder (z-lab DFlash format)")
    parser.add_argument("--adapter", default=None, help="Weaver adapter.pt (adds the weaver_* rows); optional")
    parser.add_argument("--dataset", nargs="+", default=["mt_bench"], help="weaver.data evaluation sets")
    parser.add_argument("--n-prompts", type=int, default=4, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="target continuation length per prompt")
    parser.add_argument("--anchors", type=int, default=16, help="anchors per continuation")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0], help="target temperatures")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompt choice, continuations and anchors")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", required=True, help="output CSV (columns: " + ", ".join(FIELDS) + ")")
    return parser


def main(argv: list[str] | None = None) -> None:
    from weaver.data import format_prompt, load_prompts
    from weaver.drafter import load_drafter
    from weaver.models import load_target

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.model)
    model.eval().requires_grad_(False)
    drafter = load_drafter(args.drafter).eval()
    adapter = Weaver.load(args.adapter).eval() if args.adapter else None
    name = args.model_name or Path(args.model).name
    rows = []
    for dataset in args.dataset:
        prompts = [format_prompt(tokenizer, p) for p in load_prompts(dataset, n=args.n_prompts, seed=args.seed)]
        for temperature in args.temperatures:
            result = evaluate(
                model,
                drafter,
                adapter,
                prompts,
                temperature,
                args.max_new_tokens,
                args.anchors,
                tokenizer.eos_token_id,
                args.seed,
            )
            rows += rows_for(name, dataset, temperature, result)
            print(
                f"{dataset} t={temperature:g}: "
                + " ".join(
                    f"{r.draft}@{r.depth}={r.acceptance:.2f}"
                    for r in rows_for(name, dataset, temperature, result)
                    if r.depth <= 4
                )
            )
    write_csv(args.out, rows)
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
