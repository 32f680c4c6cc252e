"""Tree sources: what the engine drafts with (DESIGN.md, "Tree sources").

A source sees the committed sequence (`begin` after prefill, `observe` after every commit), drafts from the root
(`draft`) and turns the draft into a `Tree` within a budget (`build`). The engine times the two stages separately.

Sources here need no trained model: prompt lookup (n-gram matching, a real drafter for repetitive text), an oracle
that drafts with the target itself (at temperature 0 it accepts everything) and a random source (accepts almost
nothing). The drafter-based sources (chain, ddtree, weaver, weaver_chain) wrap `weaver.drafter` + `weaver.builders`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from os import PathLike
from typing import Any, Protocol

import torch

from weaver.tree import DEFAULT_DEPTH_CAP, Tree


class TreeSource(Protocol):
    name: str
    hidden_layers: tuple[int, ...]

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None: ...

    def draft(self, root: int, generator: torch.Generator) -> Any: ...

    def build(self, draft: Any, root: int, budget: int, generator: torch.Generator) -> Tree: ...

    def observe(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None: ...


SOURCES: dict[str, Callable[..., TreeSource]] = {}


def register_source(name: str) -> Callable:
    """Register a source factory `factory(model, **options) -> TreeSource` under `name` (refuses duplicates)."""

    def decorate(factory: Callable[..., TreeSource]) -> Callable[..., TreeSource]:
        if name in SOURCES:
            raise ValueError(f"tree source {name!r} is already registered")
        SOURCES[name] = factory
        return factory

    return decorate


def check_method(method: str, name: str = "method") -> None:
    """Refuse a method that is neither "ar" nor a registered source; `name` is how the caller's user gave it."""
    if method != "ar" and method not in SOURCES:
        raise ValueError(f"unknown {name} {method!r}; choose from {', '.join(['ar', *sorted(SOURCES)])}")


def make_source(method: str, model: Any, **options: Any) -> TreeSource | None:
    """The tree source for `method`; None for plain autoregressive decoding ("ar")."""
    if method == "ar":
        return None
    if method not in SOURCES:
        raise KeyError(f"unknown method {method!r}; available: {', '.join(['ar', *sorted(SOURCES)])}")
    return SOURCES[method](model, **options)


def _trie_tree(root: int, continuations: list[list[int]], budget: int, depth_cap: int) -> Tree:
    """Merge continuations (best first) into a prefix tree of at most `budget` drafted nodes.

    Children of one node share the local draft probability uniformly (log 1/#children): the sampling verifiers need a
    q, and a lookup has no better one.
    """
    tokens, parents, kids = [root], [-1], [dict()]
    for cont in continuations:
        node = 0
        for tok in cont[:depth_cap]:
            if tok not in kids[node]:
                if len(tokens) - 1 >= budget:
                    break
                kids[node][tok] = len(tokens)
                tokens.append(tok)
                parents.append(node)
                kids.append({})
            node = kids[node][tok]
    logq = [0.0] + [-float(torch.tensor(len(kids[p])).log()) for p in parents[1:]]
    return Tree.from_lists(tokens, parents, logq)


@register_source("prompt_lookup")
class PromptLookupSource:
    """Prompt lookup decoding: continue the latest n-gram match of the suffix found earlier in the sequence.

    Matches for suffix lengths max_ngram..min_ngram, most recent first, are merged into a prefix tree, so with a budget
    larger than one continuation the tree holds alternative continuations (a chain when budget <= max_continuation).
    """

    name = "prompt_lookup"
    hidden_layers: tuple[int, ...] = ()

    def __init__(
        self,
        model: Any = None,
        *,
        max_ngram: int = 3,
        min_ngram: int = 1,
        max_matches: int = 8,
        depth_cap: int = DEFAULT_DEPTH_CAP,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram, self.max_matches, self.depth_cap = max_ngram, min_ngram, max_matches, depth_cap
        self.history: list[int] = []

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.history = prompt_ids.tolist()

    def observe(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.history.extend(tokens.tolist())

    def draft(self, root: int, generator: torch.Generator) -> list[list[int]]:
        seq = self.history + [root]
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == suffix:
                    cont = seq[start + n : start + n + self.depth_cap]
                    if cont and cont not in found:
                        found.append(cont)
                    if len(found) >= self.max_matches:
                        return found
        return found

    def build(self, draft: list[list[int]], root: int, budget: int, generator: torch.Generator) -> Tree:
        return _trie_tree(root, draft, budget, self.depth_cap)


@register_source("oracle")
class OracleSource:
    """Drafts a greedy chain with the target itself: at temperature 0 every draft is accepted.

    It keeps its own cache of the committed sequence and drafts by verifying growing chains (no state is written by
    verify), so it exercises the same verify/commit path as the engine. Cost O(budget^2): for tests, not for speed.
    """

    name = "oracle"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: Any, *, max_seq_len: int = 4096, max_draft: int = 64) -> None:
        self.model = model
        self.max_draft = max_draft
        self.cache = model.new_cache(max_seq_len=max_seq_len, max_tree_nodes=max_draft + 1)

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.cache.reset()
        self.model(prompt_ids[None], cache=self.cache)

    def observe(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.model(tokens[None], cache=self.cache)

    def draft(self, root: int, generator: torch.Generator) -> list[int]:
        return [root]

    def build(self, draft: list[int], root: int, budget: int, generator: torch.Generator) -> Tree:
        chain = [root]
        room = self.model.config.max_position_embeddings - self.cache.seq_len - 1  # drafts that fit in the context
        for _ in range(min(budget, self.max_draft, room)):
            logits = self.model.verify(Tree.chain(chain), self.cache).logits[0, -1]
            self.cache.discard_pending()
            chain.append(int(logits.argmax()))
        return Tree.chain(chain)


@register_source("random")
class RandomSource:
    """A random tree over the target's vocabulary (random shape, distinct siblings): it accepts almost nothing."""

    name = "random"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, model: Any, *, depth_cap: int = DEFAULT_DEPTH_CAP) -> None:
        self.vocab_size = model.config.vocab_size
        self.depth_cap = depth_cap

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        pass

    def observe(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        pass

    def draft(self, root: int, generator: torch.Generator) -> None:
        return None

    def build(self, draft: None, root: int, budget: int, generator: torch.Generator) -> Tree:
        tokens, parents, depths, used = [root], [-1], [0], [set()]
        for _ in range(budget):
            open_nodes = [i for i, d in enumerate(depths) if d < self.depth_cap and len(used[i]) < self.vocab_size]
            if not open_nodes:  # every node within the depth cap has the whole vocabulary as children
                break
            p = open_nodes[int(torch.randint(len(open_nodes), (1,), generator=generator))]
            tok = int(torch.randint(self.vocab_size, (1,), generator=generator))
            while tok in used[p]:
                tok = (tok + 1) % self.vocab_size
            used[p].add(tok)
            tokens.append(tok)
            parents.append(p)
            depths.append(depths[p] + 1)
            used.append(set())
        logq = [0.0] + [-float(torch.tensor(len(used[p])).log()) for p in parents[1:]]
        return Tree.from_lists(tokens, parents, logq)


class DrafterSource:
    """A factorized block drafter (DFlash-style) + a tree builder: chain, ddtree, weaver or weaver_chain.

    The drafter keeps projected context K/V of every committed token (fed by `begin` / `observe` with the target's
    hidden states); one drafter pass from the root gives the marginals of depths 1..D (`draft`), and the builder turns
    them into a tree (`build`), with the Weaver adapter for the weaver methods (METHOD.md sections 2-4).
    """

    def __init__(
        self,
        model: Any,
        method: str,
        *,
        drafter: Any,
        adapter: Any = None,
        depth_cap: int = DEFAULT_DEPTH_CAP,
        pool_size: int | None = None,
        children: int = 8,
    ) -> None:
        from weaver.adapter import BoundAdapter, Weaver
        from weaver.builders import BUILDERS
        from weaver.drafter import load_drafter

        if method not in BUILDERS:
            raise KeyError(f"unknown tree builder {method!r}; available: {', '.join(sorted(BUILDERS))}")
        self.name, self.model, self.depth_cap = method, model, depth_cap
        device = model.embed_tokens.weight.device  # checkpoints loaded here go where the target runs
        self.drafter = load_drafter(drafter).to(device) if isinstance(drafter, (str, PathLike)) else drafter
        if self.drafter.cfg.vocab_size != model.config.vocab_size:
            raise ValueError(
                f"drafter vocabulary ({self.drafter.cfg.vocab_size}) != target vocabulary "
                f"({model.config.vocab_size}): the drafter was trained for another target"
            )
        self.hidden_layers = tuple(self.drafter.hidden_layers)
        self.adapter = None
        if method.startswith("weaver"):
            if adapter is None:
                raise ValueError(f"method {method!r} needs a Weaver adapter checkpoint (--adapter PATH)")
            if isinstance(adapter, BoundAdapter):  # bound once by the caller (Engine): its pool size and fan-out
                self.adapter = adapter
            else:
                weaver = Weaver.load(adapter).to(device) if isinstance(adapter, (str, PathLike)) else adapter
                self.adapter = weaver.bind(
                    model.embed_tokens.weight, model.lm_head.weight, pool_size=pool_size, children=children
                )
        self.cache = self.drafter.new_cache()

    def begin(self, prompt_ids: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.cache = self.drafter.new_cache()
        self.drafter.extend(self.cache, hidden)

    def observe(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.drafter.extend(self.cache, hidden)

    def draft(self, root: int, generator: torch.Generator) -> Any:
        return self.drafter.draft(self.cache, root, self.model.embed_tokens, self.model.lm_head)

    def build(self, draft: Any, root: int, budget: int, generator: torch.Generator) -> Tree:
        from weaver.builders import build_tree

        return build_tree(self.name, draft, root, budget, adapter=self.adapter, depth_cap=self.depth_cap)


for _method in ("chain", "ddtree", "weaver", "weaver_chain"):
    register_source(_method)(functools.partial(DrafterSource, method=_method))
