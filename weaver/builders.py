"""Tree builders: a draft block (the drafter's D marginals) -> a draft tree (METHOD.md section 4).

    chain         argmax of each marginal (plain DFlash)
    ddtree        best-first over the full-vocabulary marginals; score = sum of marginal log-probs (arXiv 2604.12989)
    weaver        batched best-first over Weaver's pool log-probs: top-8 children per expanded node, width ceil(B/16)
    weaver_chain  Weaver's greedy chain

Every builder returns a `weaver.tree.Tree` in pop order (so parent[i] < i) whose draft_logprobs are each node's local
log-prob given its parent: the marginal's (chain, ddtree) or the pool-normalised Weaver's (weaver, weaver_chain).
Depth d of the tree uses marginal d (row d - 1 of the block); trees stop at depth min(D, depth_cap).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from weaver.adapter import BoundAdapter
from weaver.tree import DEFAULT_DEPTH_CAP, Tree

WIDTH_BUDGET_UNIT = 16  # w = ceil(B / 16) nodes per batched Weaver step ...
MAX_WIDTH = 32  # ... capped at 32


class MarginalBlock(Protocol):
    """What the builders read from a `weaver.drafter.DraftBlock`."""

    logits: torch.Tensor  # [D, V] raw drafter logits, d = 1..D
    hidden: torch.Tensor  # [D, d_model] drafter final hidden per depth
    target_hidden: torch.Tensor  # [d_model] target final hidden at the last committed position


# every builder: (block, root, budget, max_depth, adapter, width) -> Tree
Builder = Callable[[MarginalBlock, int, int, int, "BoundAdapter | None", "int | None"], Tree]
BUILDERS: dict[str, Builder] = {}


def register_builder(name: str) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to BUILDERS under `name`; refuses duplicates."""

    def add(fn: Builder) -> Builder:
        if name in BUILDERS:
            raise ValueError(f"tree builder {name!r} is already registered")
        BUILDERS[name] = fn
        return fn

    return add


def build_tree(
    method: str,
    block: MarginalBlock,
    root: int,
    budget: int,
    *,
    adapter: BoundAdapter | None = None,
    depth_cap: int = DEFAULT_DEPTH_CAP,
    width: int | None = None,
) -> Tree:
    """Build a tree of at most `budget` drafted nodes (exactly `budget` when the pools allow it).

    Args:
        method: one of BUILDERS (chain, ddtree, weaver, weaver_chain).
        block: the drafter's output (logits [D, V], hidden [D, d_model], target_hidden [d_model]).
        root: the last committed token (node 0).
        adapter: `Weaver.bind(...)` of the target; required by weaver and weaver_chain.
        width: nodes per batched Weaver step (weaver only); default ceil(budget / 16) capped at 32.
    """
    if method not in BUILDERS:
        raise KeyError(f"unknown tree builder {method!r}; available: {sorted(BUILDERS)}")
    if budget < 0 or depth_cap < 1:
        raise ValueError(f"budget must be >= 0 and depth_cap >= 1, got budget={budget}, depth_cap={depth_cap}")
    if block.logits.ndim != 2:
        raise ValueError(f"block.logits must be [D, V], got shape {tuple(block.logits.shape)}")
    max_depth = min(block.logits.shape[0], depth_cap)
    if budget == 0 or max_depth == 0:
        return Tree.root_only(root)
    if method.startswith("weaver") and adapter is None:
        raise ValueError(f"the {method!r} builder needs adapter=Weaver.bind(embed_weight, lm_head_weight)")
    return BUILDERS[method](block, root, budget, max_depth, adapter, width)


def _tree(tokens: list[int], parents: list[int], logprobs: list[float]) -> Tree:
    return Tree.from_lists(tokens, parents, logprobs)


@register_builder("chain")
def chain(block: MarginalBlock, root: int, budget: int, max_depth: int, adapter: None, width: None) -> Tree:
    """Argmax of each marginal: root -> argmax p_1 -> argmax p_2 -> ..., min(budget, max_depth) drafts."""
    n = min(budget, max_depth)
    logprobs = torch.log_softmax(block.logits[:n].float(), dim=-1)
    best, tokens = logprobs.max(dim=-1)
    return Tree.chain([root, *tokens.tolist()], [0.0, *best.tolist()])


@register_builder("ddtree")
def ddtree(block: MarginalBlock, root: int, budget: int, max_depth: int, adapter: None, width: None) -> Tree:
    """Best-first over the marginals: pop the best path, push its next-rank sibling and its first child.

    A path's score is the sum of its marginal log-probs, which only decreases along a path, so the `budget` popped
    nodes are the top-`budget` paths and form a prefix-closed subtree.
    """
    ranks = min(budget, block.logits.shape[1])
    sorted_lp, sorted_ids = torch.log_softmax(block.logits[:max_depth].float(), dim=-1).topk(ranks, dim=-1)
    lp, ids = sorted_lp.tolist(), sorted_ids.tolist()
    tokens, parents, logprobs = [root], [-1], [0.0]
    # entries: (-score, depth, rank, parent slot, parent score); depth d uses row d - 1
    heap = [(-lp[0][0], 1, 0, 0, 0.0)]
    while heap and len(tokens) <= budget:
        neg, depth, rank, parent, parent_score = heapq.heappop(heap)
        slot = len(tokens)
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        logprobs.append(lp[depth - 1][rank])
        if rank + 1 < ranks:
            heapq.heappush(heap, (-(parent_score + lp[depth - 1][rank + 1]), depth, rank + 1, parent, parent_score))
        if depth < max_depth:
            heapq.heappush(heap, (neg - lp[depth][0], depth + 1, 0, slot, -neg))
    return _tree(tokens, parents, logprobs)


class WeaverSearch:
    """Incremental Weaver state over one draft block: context K/V, pools, and the K/V of every expanded node."""

    def __init__(self, adapter: BoundAdapter, block: MarginalBlock, capacity: int) -> None:
        weaver = adapter.weaver
        self.weaver = weaver
        self.tables = adapter.tables
        self.children = adapter.children
        with torch.no_grad():
            self.context = weaver.encode_context(block.target_hidden[None].float(), block.hidden[None].float())
            self.pools = weaver.pools(block.logits, adapter.pool_size)
        layers, _, _, heads, head_dim = self.context.keys.shape
        self.node_keys = self.context.keys.new_zeros(layers, capacity, heads, head_dim)
        self.node_values = torch.zeros_like(self.node_keys)
        self.ancestors: list[list[int]] = [[] for _ in range(capacity)]  # proper ancestors of each slot, root first

    @torch.no_grad()
    def expand(self, slots: list[int], tokens: list[int], depths: list[int]) -> torch.Tensor:
        """One batched Weaver step on w new nodes; returns their pool logits [w, K] over pool(depth + 1).

        Each node attends to all 1 + D context tokens, to its proper ancestors' cached K/V, and to itself.
        """
        rows = [[*self.ancestors[s], s] for s in slots]
        width = max(len(r) for r in rows)
        device = self.node_keys.device
        seen = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
        depth = torch.tensor(depths, dtype=torch.long, device=device)
        x = self.tables.token[torch.tensor(tokens, dtype=torch.long, device=device)]  # [w, d_rank]
        new = torch.tensor(slots, dtype=torch.long, device=device)
        h = self.weaver.step(x, depth, self.context, self.node_keys, self.node_values, new, seen)
        return self.weaver.pool_scores(h, self.tables, self.pools.ids[depth], self.pools.scores[depth])

    def adopt(self, slot: int, parent: int) -> None:
        """Record a new slot's proper ancestors (its parent's ancestors plus its parent)."""
        self.ancestors[slot] = [*self.ancestors[parent], parent]


def weaver_width(budget: int) -> int:
    """Nodes per batched Weaver step: ceil(B / 16) capped at 32 (METHOD.md section 4)."""
    return min(MAX_WIDTH, max(1, math.ceil(budget / WIDTH_BUDGET_UNIT)))


@register_builder("weaver")
def weaver_tree(
    block: MarginalBlock, root: int, budget: int, max_depth: int, adapter: BoundAdapter, width: int | None
) -> Tree:
    """Batched best-first over Weaver's cumulative pool log-probs.

    Pop the best w frontier entries globally, give them slots, run ONE Weaver step on them, publish each one's top
    `children` pool children (score = parent score + logit - logsumexp over the pool); the last pop only materialises.
    Pool ids are distinct, so siblings are too.

    Publishing is lazy: an expanded node enters the frontier with its best child only, and popping its rank-r child
    pushes its rank-(r + 1) one. A sibling never outscores a better-ranked one, so the pops (and the tree) are those
    of pushing all `children` at once, while the heap holds at most one entry per expanded node: a fan-out as large
    as the pool costs no more than the paper's 8.
    """
    w = width or weaver_width(budget)
    search = WeaverSearch(adapter, block, budget + 1)
    nodes = _Nodes(tokens=[root], parents=[-1], depths=[0], logprobs=[0.0], scores=[0.0])
    ranked: dict[int, tuple[list[float], list[int]]] = {}  # expanded slot -> its children's local log-probs, tokens
    frontier: list[tuple[float, int, int, int]] = []  # (-score, tie-break, parent slot, child rank)
    tie = itertools.count()
    expand = [0]
    while True:
        if expand:
            _publish(search, nodes, expand, ranked, frontier, tie)
        if len(nodes.tokens) > budget or not frontier:
            break
        expand = []
        for _ in range(min(w, budget + 1 - len(nodes.tokens))):
            if not frontier:
                break
            neg, _, parent, rank = heapq.heappop(frontier)
            logprobs, tokens = ranked[parent]
            slot = nodes.add(tokens[rank], parent, logprobs[rank], -neg)
            search.adopt(slot, parent)
            if rank + 1 < len(tokens):
                heapq.heappush(frontier, (-(nodes.scores[parent] + logprobs[rank + 1]), next(tie), parent, rank + 1))
            if nodes.depths[slot] < max_depth:
                expand.append(slot)
        if len(nodes.tokens) > budget:
            break  # the last pop only materialises
    return _tree(nodes.tokens, nodes.parents, nodes.logprobs)


@dataclass
class _Nodes:
    """The tree under construction, in slot (pop) order; scores are cumulative path log-probs."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    logprobs: list[float]
    scores: list[float]

    def add(self, token: int, parent: int, logprob: float, score: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.logprobs.append(logprob)
        self.scores.append(score)
        return len(self.tokens) - 1


def _publish(
    search: WeaverSearch,
    nodes: _Nodes,
    expand: list[int],
    ranked: dict[int, tuple[list[float], list[int]]],
    frontier: list[tuple[float, int, int, int]],
    tie: itertools.count,
) -> None:
    """One batched Weaver step on `expand`: rank each node's top `children` pool entries into `ranked` and push its
    best one onto the frontier heap (padding pool entries, with -inf logits, are dropped)."""
    depths = [nodes.depths[s] for s in expand]
    logits = search.expand(expand, [nodes.tokens[s] for s in expand], depths)
    local = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    top_lp, top_idx = local.topk(min(search.children, local.shape[-1]), dim=-1)
    top_ids = search.pools.ids[torch.tensor(depths, device=top_idx.device)].gather(1, top_idx)
    for row, s in enumerate(expand):
        logprobs = [lp for lp in top_lp[row].tolist() if math.isfinite(lp)]
        if logprobs:
            ranked[s] = (logprobs, top_ids[row].tolist()[: len(logprobs)])
            heapq.heappush(frontier, (-(nodes.scores[s] + logprobs[0]), next(tie), s, 0))


@register_builder("weaver_chain")
def weaver_chain(
    block: MarginalBlock, root: int, budget: int, max_depth: int, adapter: BoundAdapter, width: None
) -> Tree:
    """Weaver's greedy chain: expand the root, take the best pool token, expand it, ..., min(budget, max_depth)."""
    n = min(budget, max_depth)
    search = WeaverSearch(adapter, block, n + 1)
    tokens, logprobs = [root], [0.0]
    for slot in range(n):
        if slot > 0:
            search.adopt(slot, slot - 1)
        logits = search.expand([slot], [tokens[slot]], [slot])[0]
        local = logits - torch.logsumexp(logits, dim=-1)
        best = int(local.argmax())
        tokens.append(int(search.pools.ids[slot, best]))
        logprobs.append(float(local[best]))
    return Tree.chain(tokens, logprobs)
