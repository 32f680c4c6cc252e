"""Lossless acceptance of a verified draft tree (METHOD.md section 5).

Given the target's logits at every tree node (one verify forward pass), pick the accepted root-to-node path and the
bonus token the target emits after it. Three rules:

- greedy: follow the child carrying the target's argmax; identical to autoregressive greedy decoding.
- target_only (sample-and-match, SpecInfer-style): draw y from the target at the current node, move to the child
  carrying y, else stop with bonus y. Every emitted token is a target sample, whatever the tree.
- traversal (Traversal Verification, arXiv 2505.12398): sequence-level acceptance that walks leaf-to-root, using the
  tree's draft log-probs as the proposal q. Also exactly the target's distribution. Its bonus is never a token of a
  child of the last accepted node, so on a FIXED tree it accepts the longest tree prefix of a target sample, exactly
  like target_only (the optimum for that tree; tests check E[accepted] = sum_v p_target(path to v)); it can only
  gain over target_only on trees whose nodes are themselves sampled from q.

The plain min(1, p/q) token rule is NOT offered: on trees built deterministically from top-K marginals (no draft
samples) it is biased; tests/test_verify.py shows it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from weaver.sampling import Chooser, GeneratorChooser, SamplingParams, check_logits, target_probs
from weaver.tree import Tree

SAMPLING_MODES = ("target_only", "traversal")  # the verifiers at temperature > 0
MODES = ("greedy", *SAMPLING_MODES)
GREEDY = SamplingParams()

RowProbs = Callable[[int], torch.Tensor]  # node index -> [V] float64 filtered target distribution at that node


@dataclass(frozen=True)
class Acceptance:
    """The outcome of one verify step.

    Attributes:
        path: node indices root..last accepted node (path[0] = 0; [0] when no draft is accepted).
        bonus: the token the target emits after the path (its own sample / argmax at path[-1]).
        tokens: the emitted tokens, tree tokens of path[1:] followed by bonus (len = accepted drafts + 1).
    """

    path: list[int]
    bonus: int
    tokens: list[int]

    @property
    def num_accepted(self) -> int:
        """Number of accepted drafted tokens (the bonus excluded)."""
        return len(self.path) - 1


def accept(
    tree: Tree,
    logits: torch.Tensor,
    params: SamplingParams = GREEDY,
    mode: str = "target_only",
    generator: torch.Generator | None = None,
    *,
    chooser: Chooser | None = None,
) -> Acceptance:
    """Accept a path of `tree` given the target's verify logits.

    Args:
        tree: the verified draft tree (N nodes).
        logits: [N, V] target logits; row i is the target's next-token distribution after the path root..i.
        params: sampling parameters; temperature 0 is greedy in every mode.
        mode: "greedy" (temperature 0 only), "target_only" or "traversal".
        generator: seeded torch.Generator for every random draw (required when temperature > 0).
        chooser: replaces the generator as the source of random decisions (tests enumerate them exactly).

    Returns:
        Acceptance(path, bonus, tokens).
    """
    if mode not in MODES:
        raise ValueError(f"unknown acceptance mode {mode!r}; choose one of {MODES}")
    _check_verified(tree, logits)
    if params.greedy:
        path, bonus = _greedy(tree, logits)
    else:
        if mode == "greedy":
            raise ValueError(
                f"mode 'greedy' needs temperature 0, got {params.temperature}: use target_only or traversal"
            )
        if chooser is None:
            if generator is None:
                raise ValueError("sampling (temperature > 0) needs an explicit seeded torch.Generator: pass generator=")
            chooser = GeneratorChooser(generator)

        @functools.cache
        def probs(i: int) -> torch.Tensor:
            return target_probs(logits[i : i + 1], params)[0].cpu()

        walk = _sample_and_match if mode == "target_only" else _traversal
        path, bonus = walk(tree, probs, chooser)
    return Acceptance(path=path, bonus=bonus, tokens=tree.tokens[path[1:]].tolist() + [bonus])


def expected_accepted(tree: Tree, logits: torch.Tensor, params: SamplingParams) -> float:
    """E[accepted drafts] of one verify step on `tree` under every rule here: sum over drafted nodes v of p(path to v).

    Both sampling rules accept the longest tree prefix of an exact target sample (module docstring), and greedy is
    the one-hot case, so this is exact, with no sampling noise, for a fixed tree.

    Args:
        tree: the verified draft tree (N nodes).
        logits: [N, V] target logits; row i is the target's next-token distribution after the path root..i.
        params: sampling parameters (temperature 0: one-hot argmax, the greedy rule's accepted length).
    """
    _check_verified(tree, logits)
    if tree.num_nodes == 1:
        return 0.0
    parents = tree.parents[1:].long()
    # p_target(token_v | path to parent(v)) for every drafted node v, from the rows of nodes that have children only
    # (a leaf's row is never needed), then products down the tree (parent[v] < v)
    rows, row_of = torch.unique(parents, return_inverse=True)
    step = _token_probs(logits[rows], row_of, tree.tokens[1:].long(), params).tolist()
    reach = [1.0] * tree.num_nodes
    for v, (parent, p) in enumerate(zip(parents.tolist(), step, strict=True), start=1):
        reach[v] = reach[parent] * p
    return float(sum(reach[1:]))


def _token_probs(logits: torch.Tensor, row: torch.Tensor, token: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """p_target(token[i] | logits[row[i]]) [M] under `params`, from logits [R, V].

    Unfiltered sampling (the benchmarks' temperature 1) takes a float32 log-softmax of the R rows: the float64
    target_probs costs ten times as much, which the engine would pay every step (its float32 rounding, ~1e-7
    relative, is far below any use of an expectation). Greedy and top-k / top-p go through target_probs."""
    if params.greedy or params.top_k > 0 or params.top_p < 1:
        return target_probs(logits, params)[row, token]
    x = logits.float() / params.temperature
    return (x[row, token] - torch.logsumexp(x, dim=-1)[row]).exp()


def _check_verified(tree: Tree, logits: torch.Tensor) -> None:
    """Refuse verify logits that are not one finite row [V] per node of a valid tree."""
    if logits.dim() != 2 or logits.shape[0] != tree.num_nodes:
        raise ValueError(
            f"logits must have shape [N={tree.num_nodes}, V] (one row per tree node), got {tuple(logits.shape)}"
        )
    tree.validate(vocab_size=logits.shape[1])
    check_logits(logits)


def child_by_token(tree: Tree, node: int) -> dict[int, int]:
    """{token: child index} of `node`'s children (siblings carry distinct tokens)."""
    return {int(tree.tokens[c]): c for c in tree.children(node)}


def _greedy(tree: Tree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's argmax while a child carries it (filters never move the argmax)."""
    argmax = logits.argmax(-1).tolist()
    path = [0]
    while (child := child_by_token(tree, path[-1]).get(argmax[path[-1]])) is not None:
        path.append(child)
    return path, argmax[path[-1]]


def _sample_and_match(tree: Tree, probs: RowProbs, chooser: Chooser) -> tuple[list[int], int]:
    """Draw y ~ p(.|path) at the current node; a child carrying y extends the path, otherwise y is the bonus."""
    path = [0]
    while True:
        y = chooser.choose(probs(path[-1]))
        child = child_by_token(tree, path[-1]).get(y)
        if child is None:
            return path, y
        path.append(child)


def _traversal(tree: Tree, probs: RowProbs, chooser: Chooser) -> tuple[list[int], int]:
    """Traversal Verification (arXiv 2505.12398, tree algorithm); the root always accepts (mass 1)."""
    visited = _visit(tree, 0, 1.0, probs, chooser)
    assert visited is not None, "the root has acceptance mass 1 and cannot be rejected"
    node, bonus = visited
    return tree.path_to(node), bonus


def _visit(tree: Tree, node: int, mass: float, probs: RowProbs, chooser: Chooser) -> tuple[int, int] | None:
    """Traverse the subtree of `node`, entered with acceptance mass p~(node) = `mass`.

    Invariant (the losslessness proof, by induction from the leaves): the subtree accepts with probability exactly
    `mass`, and conditioned on accepting, the emitted continuation after `node` is distributed as the target's.
    So to its parent the subtree is one coin of bias p~ followed by an exact target sample, and the sibling loop is
    recursive rejection sampling without replacement against the scaled target A = p~ p (mass p~ <= 1):
      child c drawn from q renormalised over the children not yet dropped (so siblings are tried in Plackett-Luce
      order, the law of sorting Gumbel-perturbed log q, drawn lazily) enters with
          p~(c) = min(1, A(c) / q(c));
      if its subtree rejects, A <- max(A - q, 0) / sum(max(q - A, 0)) (the residual given a rejection: in the
      paper's words, p <- norm(max(p~ p - q, 0)) and p~ <- sum max(p~ p - q, 0) / sum max(q - p~ p, 0)), drop c.
    With no child left, the node itself accepts with the remaining mass and draws the bonus from A / mass.

    Returns:
        (last accepted node, bonus token), or None when the subtree rejects.
    """
    if mass <= 0:
        return None  # A = 0: every descendant enters with p~ = 0 and the node's own coin is 0
    target = mass * probs(node)  # A, [V] float64, sums to mass
    kids = list(tree.children(node))
    while kids:
        draft = torch.softmax(tree.draft_logprobs[kids].to(torch.float64), 0)  # q over the children left
        j = chooser.choose(draft)
        token = int(tree.tokens[kids[j]])
        accepted = _visit(tree, kids[j], min(1.0, target[token].item() / draft[j].item()), probs, chooser)
        if accepted is not None:
            return accepted
        q = torch.zeros_like(target).index_put_((tree.tokens[kids],), draft)
        overlap = torch.minimum(target, q).sum().item()
        # (mass - m) / (1 - m) keeps a mass of exactly 1 at exactly 1 (the root never rejects); 1 - m > 0 here
        # because a child that entered with p~ = 1 never rejects.
        residual = (target - q).clamp(min=0)
        total = residual.sum().item()
        mass = max(0.0, (mass - overlap) / (1.0 - overlap)) if total > 0 else 0.0
        target = residual * (mass / total) if total > 0 else residual
        del kids[j]
    if node != 0 and chooser.choose(torch.tensor([1.0 - min(mass, 1.0), mass], dtype=torch.float64)) == 0:
        return None
    return node, chooser.choose(target)


def truncate_at_eos(tokens: list[int], eos_ids: Collection[int]) -> tuple[list[int], bool]:
    """Cut emitted tokens after the first EOS: an EOS inside an accepted path ends generation there.

    Returns:
        (tokens up to and including the first EOS, True), or (all tokens, False) when none is an EOS.
    """
    eos = set(eos_ids)
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[: i + 1]), True
    return list(tokens), False
