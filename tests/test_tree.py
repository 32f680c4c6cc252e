"""Draft trees as data (METHOD.md section 4): validation, ancestor mask, SGLang metadata, paths."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from weaver.tree import Tree, TreeError

THE, CAT, DOG, SAT = 10, 11, 12, 13


def docstring_tree() -> Tree:
    """The example in weaver/tree.py's module docstring."""
    return Tree.from_lists([THE, CAT, DOG, SAT], [-1, 0, 0, 1], [0.0, -0.1, -2.0, -0.3])


def random_tree(seed: int, n: int, vocab: int = 50) -> Tree:
    """A random topologically ordered tree with distinct sibling tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens, parents = [int(torch.randint(vocab, (), generator=g))], [-1]
    while len(tokens) < n:
        parent = int(torch.randint(len(tokens), (), generator=g))
        token = int(torch.randint(vocab, (), generator=g))
        if all(not (parents[c] == parent and tokens[c] == token) for c in range(len(tokens))):
            tokens.append(token)
            parents.append(parent)
    return Tree.from_lists(tokens, parents, (-torch.rand(n, generator=g)).tolist())


RANDOM_TREES = [random_tree(seed, n) for seed, n in [(0, 2), (1, 9), (2, 33), (3, 65)]]
SHAPES = {
    "root-only": Tree.root_only(7),
    "chain": Tree.chain([7, 3, 9, 3, 1]),
    "star": Tree.from_lists([7, 1, 2, 3, 4], [-1, 0, 0, 0, 0]),
    "docstring": docstring_tree(),
}


def test_docstring_example() -> None:
    tree = docstring_tree()
    assert tree.depths.tolist() == [0, 1, 1, 2]
    assert tree.budget == 3 and tree.num_nodes == 4
    assert tree.ancestor_mask().int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert tree.retrieve_next_token().tolist() == [1, 3, -1, -1]
    assert tree.retrieve_next_sibling().tolist() == [-1, 2, -1, -1]
    assert tree.retrieve_parent_token().tolist() == [-1, THE, THE, CAT]
    assert tree.retrieve_index().tolist() == [0, 1, 2, 3]
    assert tree.positions(10).tolist() == [10, 11, 11, 12]
    assert [tree.path_to(i) for i in range(4)] == [[0], [0, 1], [0, 2], [0, 1, 3]]


@pytest.mark.parametrize("tree", RANDOM_TREES + list(SHAPES.values()), ids=lambda t: f"n{t.num_nodes}")
def test_structure_matches_parent_pointers(tree: Tree) -> None:
    tree.validate()
    n, parents = tree.num_nodes, tree.parents.tolist()
    paths = [tree.path_to(i) for i in range(n)]
    for i, path in enumerate(paths):
        assert path[0] == 0 and path[-1] == i
        assert all(parents[b] == a for a, b in itertools.pairwise(path))
        assert tree.depths[i] == len(path) - 1
    # ancestor(-or-self) mask by brute force from the paths
    want = torch.tensor([[j in paths[i] for j in range(n)] for i in range(n)])
    assert torch.equal(tree.ancestor_mask(), want)
    assert torch.equal(tree.ancestor_mask(include_self=False), want & ~torch.eye(n, dtype=torch.bool))
    # SGLang linked lists: first child, then next siblings, enumerate each node's children in index order
    first, sibling = tree.retrieve_next_token().tolist(), tree.retrieve_next_sibling().tolist()
    for node in range(n):
        walked, child = [], first[node]
        while child != -1:
            walked.append(child)
            child = sibling[child]
        assert walked == [c for c in range(n) if parents[c] == node] == tree.children(node)
    parent_token = tree.retrieve_parent_token().tolist()
    assert parent_token[0] == -1
    assert all(parent_token[i] == tree.tokens[parents[i]] for i in range(1, n))
    assert torch.equal(tree.positions(5), tree.depths + 5)


def test_chain_and_root_only() -> None:
    chain = Tree.chain([7, 3, 9], [0.0, -0.5, -0.25])
    assert chain.parents.tolist() == [-1, 0, 1] and chain.depths.tolist() == [0, 1, 2]
    assert chain.draft_logprobs.tolist() == [0.0, -0.5, -0.25]
    root = Tree.root_only(4)
    assert root.budget == 0 and root.path_to(0) == [0] and root.ancestor_mask().tolist() == [[True]]
    assert root.retrieve_next_token().tolist() == [-1] and root.retrieve_parent_token().tolist() == [-1]


def raw_tree(tokens: list[int], parents: list[int], depths: list[int], logprobs: list[float] | None = None) -> Tree:
    """A Tree built field by field, bypassing from_lists' own checks (what a buggy builder could hand over)."""
    return Tree(
        tokens=torch.tensor(tokens),
        parents=torch.tensor(parents),
        depths=torch.tensor(depths),
        draft_logprobs=torch.tensor(logprobs if logprobs is not None else [0.0] * len(tokens)),
    )


@pytest.mark.parametrize(
    ("make", "kwargs", "match"),
    [
        (lambda: Tree.from_lists([1, 2, 2], [-1, 0, 0]), {}, "two children carrying token 2"),
        (lambda: Tree.from_lists([1, 2, 3, 2], [-1, 0, 1, 0]), {}, "two children carrying token 2"),
        (lambda: raw_tree([1, 2, 3], [-1, 2, 0], [0, 2, 1]), {}, "topological order"),
        (lambda: raw_tree([1, 2], [-1, 1], [0, 1]), {}, "topological order"),
        (lambda: raw_tree([1, 2], [0, -1], [0, 1]), {}, "node 0 must be the root"),
        (lambda: raw_tree([1, 2, 3], [-1, 0, 1], [0, 1, 1]), {}, "node 2 has depth 1"),
        (lambda: Tree.chain([1, 2, 3, 4]), {"budget": 2}, "3 drafted nodes, over the budget 2"),
        (lambda: Tree.chain(list(range(18))), {"depth_cap": 15}, "depth 17 exceeds the depth cap 15"),
        (lambda: Tree.from_lists([1, 2, 9], [-1, 0, 0]), {"vocab_size": 9}, r"\[0, 9\)"),
        (lambda: Tree.from_lists([1, -2], [-1, 0]), {"vocab_size": 9}, r"\[0, 9\)"),
        (lambda: Tree.chain([1, 2, 3], [0.0, -1.0, math.nan]), {}, r"finite for drafted nodes, not at nodes \[2\]"),
    ],
    ids=[
        "duplicate-siblings",
        "duplicate-siblings-apart",
        "parent-after-child",
        "self-parent",
        "root-not-first",
        "bad-depth",
        "over-budget",
        "over-depth-cap",
        "token-over-vocab",
        "negative-token",
        "nan-logprob",
    ],
)
def test_validate_refuses_bad_trees(make, kwargs: dict, match: str) -> None:
    with pytest.raises(TreeError, match=match):
        make().validate(**kwargs)


def test_valid_trees_pass_their_limits() -> None:
    Tree.chain(list(range(16))).validate(budget=15, depth_cap=15, vocab_size=16)
    # the same token may appear in different branches, only siblings must differ
    Tree.from_lists([1, 2, 3, 3, 2], [-1, 0, 0, 1, 2]).validate(vocab_size=4)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Tree.from_lists([1, 2], [-1, 1]), "topological order"),
        (lambda: Tree.from_lists([1, 2], [0, 0]), "root must have parent -1"),
        (lambda: Tree.from_lists([1, 2], [-1, 0], [0.0]), r"draft_logprobs has shape \(1,\), expected \(2,\)"),
        (lambda: Tree.from_lists([], []), "at least the root"),
    ],
    ids=["non-topological", "root-parent", "logprob-shape", "empty"],
)
def test_construction_refuses_bad_input(make, match: str) -> None:
    with pytest.raises(TreeError, match=match):
        make()
