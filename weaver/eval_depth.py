"""Per-depth acceptance of a drafter's marginals, teacher-forced (the paper's Figure 4, METHOD.md section 2).

`python -m weaver.eval_depth --model M --drafter D [--adapter A] [--adapter-at T A] --dataset mt_bench --out depth.csv`

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

With --trees, the same anchors also score whole draft trees. At temperature 0 a builder's tree rooted at x_L accepts
the longest root path that spells the target's greedy continuation x_{L+1}, x_{L+2}, ..., which is exactly what the
engine accepts in a step rooted there. At temperature > 0 the target verifies the tree on the context x_<L and the
score is the step's expected accepted drafts, sum over drafted nodes v of p(path to v) (verify.expected_accepted:
exact for target_only and traversal, no sampling noise within a step). tau = 1 + accepted drafts, averaged over
anchors. That is not a benchmark's tokens / steps: a step that accepts a tokens skips the next a - 1 positions, so
the engine weighs stretches of long acceptance less than uniform anchors do; compare builders on the same anchors.
With an adapter and at temperature 0, `pool_bound` is the longest prefix whose every token lies in its depth's top-K
drafter pool: no Weaver tree built on those pools can accept more, and a perfect adapter's chain reaches it.
With --oracle, `oracle` is the best tree of the budget and depth (the most probable target paths: at temperature 0
the greedy chain), and at temperature > 0 `pool_bound` is the best tree over the adapter's pools; no drafter, or no
Weaver adapter over those pools, can do better on the same anchors.
"""

from __future__ import annotations

import argparse
import csv
import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from weaver.adapter import BoundAdapter, Weaver, candidate_pools
from weaver.builders import BUILDERS, build_tree
from weaver.drafter import DraftBlock
from weaver.sampling import SamplingParams, target_probs
from weaver.training.adapter import draft_at_anchors, teacher_forced_logits
from weaver.training.features import anchor_range, regenerate
from weaver.tree import Tree
from weaver.verify import child_by_token, expected_accepted

DRAFTS = ("argmax", "sample", "weaver_argmax", "weaver_sample")
FIELDS = ("model", "dataset", "temperature", "depth", "draft", "acceptance", "n")
POOL_BOUND = "pool_bound"
ORACLE = "oracle"
ORACLE_LOOKAHEAD = 16  # frontier entries whose conditionals one oracle verify also reads (exactness is unaffected)
TREE_FIELDS = ("model", "dataset", "temperature", "method", "budget", "children", "tau", "n")


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


@dataclass(frozen=True)
class TreeRow:
    """Teacher-forced tau = 1 + mean (expected, at temperature > 0) accepted drafts of one builder over n anchors.

    children: the Weaver builders' fan-out (0 without an adapter); method POOL_BOUND is the perfect-adapter bound.
    """

    model: str
    dataset: str
    temperature: float
    method: str
    budget: int
    children: int
    tau: float
    n: int


@dataclass(frozen=True)
class TreeSpec:
    """Builders scored on whole trees, their budget, the bound adapter the weaver builders need, and `oracle`: add the
    best possible trees, ORACLE and at temperature > 0 POOL_BOUND (an adapter always brings it at temperature 0)."""

    methods: tuple[str, ...]
    budget: int
    adapter: BoundAdapter | None = None
    oracle: bool = False


@dataclass(frozen=True)
class Drafts:
    """The drafter's blocks at A anchors L of one sequence ids [T] (root x_L; context x_<L), teacher-forced.

    target_logits: [T, V] the target's logits over ids; logits: [A, D, V] drafter marginals; proposal: [A, D, d_model]
    drafter hidden; target_hidden: [A, d_model] the target's last-layer output at L - 1.
    """

    ids: torch.Tensor
    anchors: list[int]
    target_logits: torch.Tensor
    logits: torch.Tensor
    proposal: torch.Tensor
    target_hidden: torch.Tensor

    def truth(self, row: int) -> list[int]:
        """The target's continuation x_{L+1}, ..., x_{L+D} after anchor `row` (shorter at the end of the sequence)."""
        start = self.anchors[row] + 1
        return self.ids[start : start + self.logits.shape[1]].tolist()


@torch.no_grad()
def draft_sequence(model: Any, drafter: Any, ids: torch.Tensor, anchors: Sequence[int]) -> Drafts:
    """One target forward over ids [T] and the drafter's blocks at every anchor."""
    out = model(ids[None], cache=None, hidden_layers=drafter.hidden_layers)
    example = {"ids": ids, "hidden": out.hidden[0]}
    embed, lm_head = model.embed_tokens.weight.float(), model.lm_head.weight.float()
    logits, proposal, target_hidden = draft_at_anchors(drafter, example, list(anchors), embed, lm_head)
    return Drafts(ids, list(anchors), out.logits[0], logits, proposal, target_hidden)


@torch.no_grad()
def sequence_acceptance(
    model: Any,
    drafter: Any,
    adapter: Weaver | None,
    ids: torch.Tensor,
    anchors: Sequence[int],
    temperature: float,
    drafts: Drafts | None = None,
) -> dict[str, torch.Tensor]:
    """Per-anchor, per-depth acceptance of each draft kind on one sequence ids [T].

    Returns {draft: [A, D] acceptance} plus "valid" [A, D] (the target's conditional at L + d - 1 exists: L + d <= T).
    drafts: draft_sequence(model, drafter, ids, anchors) when the caller already has it.
    """
    if drafts is None:
        drafts = draft_sequence(model, drafter, ids, anchors)
    elif drafts.anchors != list(anchors) or not torch.equal(drafts.ids, ids):
        raise ValueError("drafts were made for other ids or anchors: pass draft_sequence(model, drafter, ids, anchors)")
    logits = drafts.logits
    depth = logits.shape[1]
    # depth d (index d - 1) is scored by the target's conditional at position L + d - 1
    pos = torch.tensor(drafts.anchors)[:, None] + torch.arange(depth)
    valid = pos < ids.numel()
    pos = pos.clamp(max=ids.numel() - 1)
    p = target_probs(drafts.target_logits.float(), SamplingParams(temperature=temperature))[pos].float()  # [A, D, V]
    q = torch.softmax(logits.float(), dim=-1)
    result = {
        "argmax": p.gather(-1, q.argmax(-1, keepdim=True))[..., 0],
        "sample": (q * p).sum(-1),
        "valid": valid,
    }
    if adapter is not None:
        embed, lm_head = model.embed_tokens.weight.float(), model.lm_head.weight.float()
        pools = candidate_pools(logits, adapter.config.candidate_pool_size)
        chains = ids[pos]
        w_logits = teacher_forced_logits(adapter, drafts.target_hidden, drafts.proposal, chains, pools, embed, lm_head)
        w = torch.softmax(w_logits.float(), dim=-1)
        p_pool = p.gather(-1, pools.ids.long())
        result["weaver_argmax"] = p_pool.gather(-1, w.argmax(-1, keepdim=True))[..., 0]
        result["weaver_sample"] = (w * p_pool).sum(-1)
    return result


def accepted_drafts(tree: Tree, truth: Sequence[int]) -> int:
    """Drafts a greedy verifier accepts when the target continues with `truth`: the longest root path spelling it."""
    node = 0
    for depth, token in enumerate(truth):
        node = child_by_token(tree, node).get(token)
        if node is None:
            return depth
    return len(truth)


def pool_prefix(logits: torch.Tensor, truth: Sequence[int], pool_size: int) -> int:
    """Longest d with each of truth[0..d-1] in the top-`pool_size` pool of its depth's marginal (logits [D, V])."""
    pools = candidate_pools(logits[: len(truth)], pool_size).ids
    hits = (pools == torch.tensor(truth, dtype=pools.dtype)[:, None]).any(-1).tolist()
    return hits.index(False) if False in hits else len(hits)


@torch.no_grad()
def tree_acceptance(
    drafts: Drafts, methods: Sequence[str], budget: int, adapter: BoundAdapter | None, oracle: bool = False
) -> dict[str, torch.Tensor]:
    """Accepted drafts [A] per builder at temperature 0, plus POOL_BOUND [A] when an adapter is given and, with
    `oracle`, ORACLE [A]: the target's greedy chain, the best tree of this budget and depth."""
    result: dict[str, list[int]] = {name: [] for name in methods}
    if adapter is not None:
        result[POOL_BOUND] = []
    if oracle:
        result[ORACLE] = []
    for row, anchor in enumerate(drafts.anchors):
        block = DraftBlock(drafts.logits[row], drafts.proposal[row], drafts.target_hidden[row])
        root, truth = int(drafts.ids[anchor]), drafts.truth(row)
        for name in methods:
            tree = build_tree(name, block, root, budget, adapter=adapter)
            result[name].append(accepted_drafts(tree, truth))
        if adapter is not None:
            result[POOL_BOUND].append(pool_prefix(drafts.logits[row], truth, adapter.pool_size))
        if oracle:
            result[ORACLE].append(min(budget, len(truth)))
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in result.items()}


@torch.no_grad()
def verify_logits(model: Any, cache: Any, tree: Tree) -> torch.Tensor:
    """The target's logits [N, V] (fp32, host) at every node of `tree` on the cache's context; nothing is committed."""
    logits = model.verify(tree, cache).logits[0].float().cpu()
    cache.discard_pending()
    return logits


@torch.no_grad()
def tree_expected_acceptance(
    model: Any,
    drafts: Drafts,
    methods: Sequence[str],
    budget: int,
    adapter: BoundAdapter | None,
    params: SamplingParams,
    oracle: bool = False,
) -> dict[str, torch.Tensor]:
    """Expected accepted drafts [A] per builder: each tree rooted at x_L is verified by the target on x_<L.

    One cache walks the sequence anchor to anchor (committing x_<L as a chain, then verifying every builder's tree
    and discarding it), so attention and GDN targets both see exactly the context the engine has at that root.
    With `oracle`, also ORACLE [A] (best_tree_accepted: no tree of this budget and depth accepts more) and, with an
    adapter, POOL_BOUND [A] (the same over the adapter's top-K drafter pools: no Weaver tree accepts more).
    """
    ids, depth = drafts.ids, drafts.logits.shape[1]
    cache = model.new_cache(max_seq_len=ids.numel(), max_tree_nodes=budget + 1 + ORACLE_LOOKAHEAD)
    names = [*methods, *([ORACLE] if oracle else []), *([POOL_BOUND] if oracle and adapter is not None else [])]
    result: dict[str, list[float]] = {name: [] for name in names}
    for row, anchor in enumerate(drafts.anchors):
        if anchor > cache.seq_len:
            model(ids[None, cache.seq_len : anchor], cache=cache)
        root = int(ids[anchor])
        block = DraftBlock(drafts.logits[row], drafts.proposal[row], drafts.target_hidden[row])
        for name in methods:
            tree = build_tree(name, block, root, budget, adapter=adapter)
            result[name].append(expected_accepted(tree, verify_logits(model, cache, tree), params))
        if oracle:
            result[ORACLE].append(best_tree_accepted(model, cache, root, budget, depth, params))
        if oracle and adapter is not None:
            pools = candidate_pools(drafts.logits[row], adapter.pool_size).ids
            result[POOL_BOUND].append(best_tree_accepted(model, cache, root, budget, depth, params, pools))
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in result.items()}


@torch.no_grad()
def best_tree_accepted(
    model: Any,
    cache: Any,
    root: int,
    budget: int,
    depth_cap: int,
    params: SamplingParams,
    pools: torch.Tensor | None = None,
) -> float:
    """The most expected accepted drafts of any tree rooted at `root` on the cache's context: <= budget drafted nodes,
    depth <= depth_cap, depth d's tokens in pools[d - 1] when pools [D, K] (token ids, -1 = padding) are given.

    E[accepted] is the sum of the nodes' target path probabilities (verify.expected_accepted) and a child's never
    exceeds its parent's, so the best tree holds the `budget` most probable paths: exact best-first over the target's
    own conditionals. A node's conditional is read when it is popped; each verify also reads those of the next
    ORACLE_LOOKAHEAD frontier entries (tentative leaves), which later pops reuse.
    """
    tokens, parents, depths, reach = [root], [-1], [0], [1.0]
    frontier: list[tuple[float, int, int]] = []  # (-path probability, parent node, token)
    known: dict[tuple[int, int], torch.Tensor] = {}  # (parent node, token) -> that child's conditional [V]
    node, conditional = 0, None
    while True:
        if conditional is None:  # verify the tree (node is its newest) plus the best frontier entries as leaves
            ahead = [(parent, token) for _, parent, token in heapq.nsmallest(ORACLE_LOOKAHEAD, frontier)]
            tree = Tree.from_lists(tokens + [t for _, t in ahead], parents + [p for p, _ in ahead])
            probs = target_probs(verify_logits(model, cache, tree)[node:], params)
            conditional = probs[0]
            known.update({key: probs[1 + i] for i, key in enumerate(ahead)})
        if depths[node] < depth_cap:
            allowed = conditional
            if pools is not None:
                ids = pools[depths[node]]
                ids = ids[ids >= 0]
                allowed = torch.zeros_like(conditional).index_copy_(0, ids, conditional[ids])
            top = allowed.topk(min(budget, allowed.numel()))
            for p, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                if p > 0:
                    heapq.heappush(frontier, (-reach[node] * p, node, token))
        if not frontier:
            break
        neg, parent, token = heapq.heappop(frontier)
        tokens.append(token)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        reach.append(-neg)
        if len(tokens) > budget:  # the last node is never expanded
            break
        node = len(tokens) - 1
        conditional = known.pop((parent, token), None)
    return float(sum(reach[1:]))


def pick_anchors(prompt_len: int, length: int, count: int, generator: torch.Generator) -> list[int]:
    """Up to `count` sorted anchors L with the root x_L in [prompt_len - 1, length - 2] (drafts in the continuation)."""
    anchors = anchor_range(prompt_len, length)
    if not anchors:
        return []
    choice = torch.randperm(len(anchors), generator=generator)[:count] + anchors.start
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
    trees: TreeSpec | None = None,
) -> dict[str, torch.Tensor]:
    """Mean acceptance [D] and counts [D] per draft kind over the target's continuations of `prompts`.

    With `trees`, also "tree:<method>" (and "tree:pool_bound", "tree:oracle" as TreeSpec says): the mean accepted
    drafts per anchor (expected, at temperature > 0), a 0-dim tensor, and "tree_n" the number of anchors.
    """
    sequences = regenerate(model, prompts, max_new_tokens, [temperature], eos_id, batch_size=8, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros(drafter.cfg.block_size - 1, dtype=torch.float64))
    count = torch.zeros(drafter.cfg.block_size - 1, dtype=torch.float64)
    tree_sums: dict[str, float] = defaultdict(float)
    tree_n = 0
    for seq in sequences:
        anchors = pick_anchors(seq.prompt_len, len(seq.ids), anchors_per_seq, gen)
        if not anchors:
            continue
        ids = torch.tensor(seq.ids)
        drafts = draft_sequence(model, drafter, ids, anchors)
        acc = sequence_acceptance(model, drafter, adapter, ids, anchors, temperature, drafts)
        valid = acc.pop("valid").double()
        count += valid.sum(0)
        for name, value in acc.items():
            sums[name] += (value.double() * valid).sum(0)
        if trees is not None:
            if temperature == 0:
                scored = tree_acceptance(drafts, trees.methods, trees.budget, trees.adapter, trees.oracle)
            else:
                params = SamplingParams(temperature=temperature)
                scored = tree_expected_acceptance(
                    model, drafts, trees.methods, trees.budget, trees.adapter, params, trees.oracle
                )
            for name, accepted in scored.items():
                tree_sums[name] += float(accepted.sum())
            tree_n += len(anchors)
    if not count.any():
        raise ValueError("no anchor had a continuation to score: raise --max-new-tokens or use longer prompts")
    result = {name: total / count.clamp_min(1) for name, total in sums.items()} | {"n": count}
    if tree_n:
        result |= {f"tree:{name}": torch.tensor(total / tree_n) for name, total in tree_sums.items()}
        result["tree_n"] = torch.tensor(tree_n)
    return result


def tree_rows_for(
    model_name: str, dataset: str, temperature: float, spec: TreeSpec, result: dict[str, torch.Tensor]
) -> list[TreeRow]:
    """CSV rows of the teacher-forced trees of one evaluate() result at `temperature` (none if it ran without trees)."""
    if "tree_n" not in result:
        return []
    children = spec.adapter.children if spec.adapter is not None else 0
    n = int(result["tree_n"])
    names = [name for name in (*spec.methods, POOL_BOUND, ORACLE) if f"tree:{name}" in result]
    return [
        TreeRow(model_name, dataset, temperature, name, spec.budget, children, 1.0 + float(result[f"tree:{name}"]), n)
        for name in names
    ]


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


def write_csv(path: str | Path, rows: Sequence[DepthRow | TreeRow], fields: Sequence[str] = FIELDS) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        writer.writerows([getattr(r, k) for k in fields] for r in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m weaver.eval_depth", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="target: registry name or local folder")
    parser.add_argument("--model-name", default=None, help="name in the CSV (default: the basename of --model)")
    parser.add_argument("--drafter", required=True, help="drafter folder (z-lab DFlash format)")
    parser.add_argument("--adapter", default=None, help="Weaver adapter.pt (adds the weaver_* rows); optional")
    parser.add_argument(
        "--adapter-at",
        nargs=2,
        action="append",
        default=[],
        metavar=("TEMPERATURE", "ADAPTER"),
        help="a Weaver adapter.pt for one of --temperatures only, in place of --adapter there (repeatable; e.g. one "
        "trained on completions sampled at that temperature)",
    )
    parser.add_argument("--dataset", nargs="+", default=["mt_bench"], help="weaver.data evaluation sets")
    parser.add_argument("--n-prompts", type=int, default=4, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="target continuation length per prompt")
    parser.add_argument("--anchors", type=int, default=16, help="anchors per continuation")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.0], help="target temperatures")
    parser.add_argument("--seed", type=int, default=0, help="seed of prompt choice, continuations and anchors")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--out", required=True, help="output CSV (columns: " + ", ".join(FIELDS) + ")")
    parser.add_argument(
        "--trees",
        nargs="+",
        default=[],
        choices=sorted(BUILDERS),
        help="tree builders to score teacher-forced at every --temperatures (needs --trees-out)",
    )
    parser.add_argument("--budget", type=int, default=64, help="tree budget of --trees (drafted nodes)")
    parser.add_argument("--children", type=int, default=8, help="fan-out of the weaver builders in --trees")
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="candidate pool size K of the weaver builders and pool_bound in --trees (default: the adapter's own)",
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="with --trees: add the best tree of the budget ('oracle') and at temperature > 0 the best over the "
        "adapter's pools ('pool_bound'); each costs up to --budget target verifies per anchor",
    )
    parser.add_argument(
        "--trees-out", default=None, help="output CSV of --trees (columns: " + ", ".join(TREE_FIELDS) + ")"
    )
    return parser


def adapter_paths(args: argparse.Namespace) -> dict[float, str | None]:
    """The adapter checkpoint scored at each of --temperatures: its --adapter-at one, else --adapter (None: none).

    Refuses an --adapter-at temperature that is not a number, is given twice, or is not among --temperatures."""
    chosen: dict[float, str | None] = dict.fromkeys(args.temperatures, args.adapter)
    seen: set[float] = set()
    for text, path in args.adapter_at:
        try:
            temperature = float(text)
        except ValueError:
            raise SystemExit(
                f"--adapter-at {text} {path}: {text!r} is not a temperature (e.g. --adapter-at 1 a.pt)"
            ) from None
        if temperature in seen:
            raise SystemExit(f"--adapter-at: temperature {text} is given twice; keep one adapter per temperature")
        if temperature not in chosen:
            raise SystemExit(
                f"--adapter-at {text} {path}: {text} is not one of --temperatures "
                f"{' '.join(f'{t:g}' for t in args.temperatures)}; add it there or drop the adapter"
            )
        seen.add(temperature)
        chosen[temperature] = path
    return chosen


def check_tree_args(args: argparse.Namespace) -> None:
    """Refuse --trees settings that could not produce rows, before any model is loaded."""
    adapters = adapter_paths(args)
    if not args.trees:
        for flag, value in (("--trees-out", args.trees_out), ("--oracle", args.oracle)):
            if value:
                raise SystemExit(f"{flag} needs --trees: name the builders to score (e.g. --trees ddtree weaver)")
        return
    if not args.trees_out:
        raise SystemExit("--trees needs --trees-out: the CSV the tree rows are written to")
    missing = [f"{t:g}" for t, path in adapters.items() if path is None]
    if any(m.startswith("weaver") for m in args.trees) and missing:
        raise SystemExit(
            f"--trees weaver/weaver_chain needs a Weaver checkpoint at every temperature (none at {' '.join(missing)}):"
            " give --adapter, or --adapter-at for each"
        )
    if args.budget < 1:
        raise SystemExit(f"--budget must be >= 1, got {args.budget}")
    if args.pool_size is not None and missing:
        raise SystemExit("--pool-size needs --adapter: it sets the pools of the weaver builders and pool_bound")
    if args.pool_size is not None and args.pool_size < 1:
        raise SystemExit(f"--pool-size must be >= 1, got {args.pool_size}")


def main(argv: list[str] | None = None) -> None:
    from weaver.data import format_prompt, load_prompts
    from weaver.drafter import load_drafter
    from weaver.models import load_target

    args = build_parser().parse_args(argv)
    check_tree_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.model)
    model.eval().requires_grad_(False)
    drafter = load_drafter(args.drafter).eval()
    chosen = adapter_paths(args)
    for temperature, path in chosen.items():
        print(f"t={temperature:g}: adapter {path}")
    loaded = {path: Weaver.load(path).eval() for path in dict.fromkeys(chosen.values()) if path is not None}
    name = args.model_name or Path(args.model).name
    trees: dict[float, TreeSpec | None] = dict.fromkeys(args.temperatures)
    if args.trees:
        embed, lm_head = model.embed_tokens.weight.float(), model.lm_head.weight.float()
        bound = {
            path: adapter.bind(embed, lm_head, pool_size=args.pool_size, children=args.children)
            for path, adapter in loaded.items()
        }
        for temperature, path in chosen.items():
            adapter = bound[path] if path is not None else None
            trees[temperature] = TreeSpec(tuple(args.trees), args.budget, adapter, args.oracle)
    rows, tree_rows = [], []
    for dataset in args.dataset:
        prompts = [format_prompt(tokenizer, p) for p in load_prompts(dataset, n=args.n_prompts, seed=args.seed)]
        for temperature in args.temperatures:
            adapter = loaded[chosen[temperature]] if chosen[temperature] is not None else None
            spec = trees[temperature]
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
                spec,
            )
            rows += rows_for(name, dataset, temperature, result)
            if spec is not None:
                scored = tree_rows_for(name, dataset, temperature, spec, result)
                tree_rows += scored
                print(
                    f"{dataset} t={temperature:g} trees at b{spec.budget}: "
                    + " ".join(f"{r.method}={r.tau:.3f}" for r in scored)
                )
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
    if args.trees:
        write_csv(args.trees_out, tree_rows, TREE_FIELDS)
        print(f"wrote {len(tree_rows)} rows to {args.trees_out}")


if __name__ == "__main__":
    main()
