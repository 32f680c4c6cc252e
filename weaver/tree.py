"""Draft trees as data (METHOD.md section 4).

A tree holds N nodes in topological order: node 0 is the root (the last committed token, not yet seen by the
target) and every other node's parent has a smaller index. The verifier runs all N nodes through the target in one
forward pass; acceptance walks a root-to-leaf path.

Example (budget 3, N = 4)::

        0 ("The")
       / \\
      1   2        tokens  = [The, cat, dog, sat]
      |            parents = [-1, 0, 0, 1]
      3            depths  = [0, 1, 1, 2]

    ancestor_mask (row i attends to column j):      retrieve_next_token   = [1, 3, -1, -1]
        1 0 0 0                                      retrieve_next_sibling = [-1, 2, -1, -1]
        1 1 0 0                                      positions(seq_len=10)  = [10, 11, 11, 12]
        1 0 1 0
        1 1 0 1
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

DEFAULT_DEPTH_CAP = 15


class TreeError(ValueError):
    """A tree that violates an invariant the verifier relies on."""


@dataclass(frozen=True, eq=False)
class Tree:
    """A draft tree for one sequence.

    Attributes:
        tokens: [N] int64 token ids; tokens[0] is the root (last committed token).
        parents: [N] int64 parent node index, parents[0] = -1 and parents[i] < i.
        depths: [N] int64 depth, depths[0] = 0 and depths[i] = depths[parents[i]] + 1.
        draft_logprobs: [N] float32 local draft log-prob of each node given its parent (the verifier's q;
            0 for the root).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_logprobs: torch.Tensor
    _children: list[list[int]] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        n = self.tokens.numel()
        for name in ("parents", "depths", "draft_logprobs"):
            if getattr(self, name).shape != (n,):
                raise TreeError(f"Tree.{name} has shape {tuple(getattr(self, name).shape)}, expected ({n},)")
        if n == 0:
            raise TreeError("a tree needs at least the root node")
        children: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(self.parents.tolist()[1:], start=1):
            if 0 <= p < i:
                children[p].append(i)
        object.__setattr__(self, "_children", children)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_lists(
        cls,
        tokens: list[int],
        parents: list[int],
        draft_logprobs: list[float] | None = None,
    ) -> Tree:
        """Build a tree from python lists; depths are derived from parents (which must be topological)."""
        depths: list[int] = []
        for i, p in enumerate(parents):
            if i == 0:
                if p != -1:
                    raise TreeError(f"root must have parent -1, got {p}")
                depths.append(0)
            elif not 0 <= p < i:
                raise TreeError(f"node {i} has parent {p}: nodes must be in topological order (0 <= parent < index)")
            else:
                depths.append(depths[p] + 1)
        if draft_logprobs is None:
            draft_logprobs = [0.0] * len(tokens)
        return cls(
            tokens=torch.tensor(tokens, dtype=torch.long),
            parents=torch.tensor(parents, dtype=torch.long),
            depths=torch.tensor(depths, dtype=torch.long),
            draft_logprobs=torch.tensor(draft_logprobs, dtype=torch.float32),
        )

    @classmethod
    def chain(cls, tokens: list[int], draft_logprobs: list[float] | None = None) -> Tree:
        """A chain root -> tokens[1] -> tokens[2] -> ... (plain chain speculative decoding)."""
        return cls.from_lists(tokens, list(range(-1, len(tokens) - 1)), draft_logprobs)

    @classmethod
    def root_only(cls, token: int) -> Tree:
        """A tree with no drafts: verification degenerates to one autoregressive step."""
        return cls.from_lists([token], [-1])

    def truncate(self, max_depth: int) -> Tree:
        """The nodes at depth <= max_depth, in the same order (a prefix-closed subtree: ancestors are shallower);
        self when nothing is deeper."""
        if int(self.depths.max()) <= max_depth:
            return self
        keep = torch.nonzero(self.depths <= max_depth).flatten()
        new_index = torch.full((self.num_nodes,), -1, dtype=torch.long)
        new_index[keep] = torch.arange(keep.numel())
        parents = self.parents[keep]
        parents = torch.where(parents >= 0, new_index[parents.clamp(min=0)], parents)
        return Tree(self.tokens[keep], parents, self.depths[keep], self.draft_logprobs[keep])

    # ------------------------------------------------------------------ structure
    @property
    def num_nodes(self) -> int:
        return self.tokens.numel()

    @property
    def budget(self) -> int:
        """Number of drafted (non-root) nodes."""
        return self.tokens.numel() - 1

    def children(self, node: int) -> list[int]:
        """Children of `node` in index order."""
        return self._children[node]

    def path_to(self, node: int) -> list[int]:
        """Node indices root..node."""
        path = []
        parents = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]

    def validate(
        self, *, budget: int | None = None, depth_cap: int | None = None, vocab_size: int | None = None
    ) -> None:
        """Raise TreeError naming the first violated invariant."""
        for name in ("tokens", "parents", "depths"):
            if getattr(self, name).dtype != torch.long:
                raise TreeError(f"Tree.{name} must be int64, got {getattr(self, name).dtype}")
        n = self.num_nodes
        parents = self.parents.tolist()
        depths = self.depths.tolist()
        tokens = self.tokens.tolist()
        if parents[0] != -1 or depths[0] != 0:
            raise TreeError(f"node 0 must be the root (parent -1, depth 0), got parent {parents[0]}, depth {depths[0]}")
        for i in range(1, n):
            p = parents[i]
            if not 0 <= p < i:
                raise TreeError(f"node {i} has parent {p}: nodes must be in topological order (0 <= parent < index)")
            if depths[i] != depths[p] + 1:
                raise TreeError(f"node {i} has depth {depths[i]} but its parent {p} has depth {depths[p]}")
        for node, kids in enumerate(self._children):
            seen: set[int] = set()
            for c in kids:
                if tokens[c] in seen:
                    raise TreeError(
                        f"node {node} has two children carrying token {tokens[c]}: siblings must be distinct"
                    )
                seen.add(tokens[c])
        if budget is not None and n - 1 > budget:
            raise TreeError(f"tree has {n - 1} drafted nodes, over the budget {budget}")
        if depth_cap is not None and max(depths) > depth_cap:
            raise TreeError(f"tree depth {max(depths)} exceeds the depth cap {depth_cap}")
        if vocab_size is not None and (min(tokens) < 0 or max(tokens) >= vocab_size):
            raise TreeError(
                f"tree tokens must lie in [0, {vocab_size}) (the target's vocabulary), got range "
                f"[{min(tokens)}, {max(tokens)}]: is the drafter built for another tokenizer?"
            )
        if not torch.isfinite(self.draft_logprobs[1:]).all():
            bad = (1 + (~torch.isfinite(self.draft_logprobs[1:])).nonzero().flatten()).tolist()
            raise TreeError(f"draft_logprobs must be finite for drafted nodes, not at nodes {bad}")

    # ------------------------------------------------------------------ verifier inputs
    def ancestor_mask(self, include_self: bool = True) -> torch.Tensor:
        """[N, N] bool; mask[i, j] is True iff j is an ancestor of i (or i itself when include_self)."""
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        parents = self.parents.tolist()
        for i in range(n):
            if parents[i] >= 0:
                mask[i] = mask[parents[i]]
                mask[i, parents[i]] = True
        if include_self:
            mask |= torch.eye(n, dtype=torch.bool)
        return mask

    def positions(self, seq_len: int) -> torch.Tensor:
        """[N] int64 absolute positions of the nodes when `seq_len` tokens are committed before the root."""
        return self.depths + seq_len

    # ------------------------------------------------------------------ SGLang metadata
    def retrieve_index(self) -> torch.Tensor:
        """[N] int64 index of each node in the flattened draft-token array (identity for one request)."""
        return torch.arange(self.num_nodes, dtype=torch.long)

    def retrieve_next_token(self) -> torch.Tensor:
        """[N] int64 first child of each node, -1 for leaves."""
        return torch.tensor([kids[0] if kids else -1 for kids in self._children], dtype=torch.long)

    def retrieve_next_sibling(self) -> torch.Tensor:
        """[N] int64 next sibling (same parent, next in index order), -1 if none."""
        nxt = [-1] * self.num_nodes
        for kids in self._children:
            for a, b in itertools.pairwise(kids):
                nxt[a] = b
        return torch.tensor(nxt, dtype=torch.long)

    def retrieve_parent_token(self) -> torch.Tensor:
        """[N] int64 token id carried by each node's parent, -1 for the root."""
        out = self.tokens[self.parents.clamp(min=0)].clone()
        out[0] = -1
        return out
