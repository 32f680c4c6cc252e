"""Acceptance rules (METHOD.md section 5): greedy on hand-made trees, and EXACT losslessness of the sampling rules.

Losslessness is proven on a toy target over V = 5 tokens whose conditional p(.|context) is defined for every context.
The verifiers draw every random decision through a `Chooser`; a scripted chooser enumerates all decision sequences
with their probabilities, which gives the exact distribution of the emitted tokens. Extended by the target's own
conditionals to M tokens, it must equal the target's M-token distribution to float64 precision. A chi-square test on
seeded draws checks the production generator path too.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare

from weaver.sampling import GeneratorChooser, SamplingParams, target_probs
from weaver.tree import Tree, TreeError
from weaver.verify import accept, expected_accepted, truncate_at_eos

V = 5
ROOT = 1
SAMPLING = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-topk3": SamplingParams(temperature=0.7, top_k=3),
    "t1.3-topp0.8": SamplingParams(temperature=1.3, top_p=0.8),
}


# ---------------------------------------------------------------------------------------------------- toy target
def toy_logits(context: tuple[int, ...]) -> torch.Tensor:
    """[V] float32 logits of the toy target after `context`; about a quarter of the entries are -inf."""
    g = torch.Generator().manual_seed(zlib.crc32(bytes(context)))
    logits = torch.randn(V, generator=g)
    banned = torch.rand(V, generator=g) < 0.25
    banned[torch.randint(V, (), generator=g)] = False  # keep one token allowed
    return logits.masked_fill(banned, -math.inf)


def tree_logits(tree: Tree) -> torch.Tensor:
    """[N, V] verify logits: row i is the toy target after the tokens root..i."""
    return torch.stack([toy_logits(tuple(tree.tokens[tree.path_to(i)].tolist())) for i in range(tree.num_nodes)])


def target_sequence_dist(params: SamplingParams, m: int) -> dict[tuple[int, ...], float]:
    """Exact distribution of the target's next m tokens after the root."""
    dist = {(): 1.0}
    for _ in range(m):
        nxt = {}
        for seq, p in dist.items():
            probs = target_probs(toy_logits((ROOT, *seq))[None], params)[0]
            for y in range(V):
                nxt[(*seq, y)] = p * probs[y].item()
        dist = nxt
    return dist


def extend_to(outcomes: dict[tuple[int, ...], float], params: SamplingParams, m: int) -> dict[tuple[int, ...], float]:
    """First m tokens of (emitted tokens, then the target's own samples when fewer than m were emitted)."""
    dist: dict[tuple[int, ...], float] = Counter()
    for emitted, p in outcomes.items():
        head = emitted[:m]
        for tail in itertools.product(range(V), repeat=m - len(head)):
            q, seq = p, head
            for y in tail:
                q *= target_probs(toy_logits((ROOT, *seq))[None], params)[0, y].item()
                seq = (*seq, y)
            dist[seq] += q
    return dist


# ---------------------------------------------------------------------------------------------------- enumeration
class _Branch(Exception):
    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights


class ScriptedChooser:
    """Replays a prefix of decisions (multiplying their probabilities); the first unscripted decision raises _Branch."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.prob = script, 1.0

    def choose(self, weights: torch.Tensor) -> int:
        w = weights.to(torch.float64) / weights.sum()
        if not self.script:
            raise _Branch(w)
        i, self.script = self.script[0], self.script[1:]
        self.prob *= w[i].item()
        return i


def enumerate_decisions(run: Callable[[ScriptedChooser], list[int]]) -> dict[tuple[int, ...], float]:
    """Exact distribution of run(chooser)'s tokens over all decision sequences (zero-probability ones pruned)."""
    outcomes: dict[tuple[int, ...], float] = Counter()
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        chooser = ScriptedChooser(script)
        try:
            tokens = run(chooser)
        except _Branch as branch:
            stack += [script + [i] for i in range(len(branch.weights)) if branch.weights[i] > 0]
            continue
        outcomes[tuple(tokens)] += chooser.prob
    return outcomes


def enumerate_acceptance(tree: Tree, logits: torch.Tensor, params: SamplingParams, mode: str) -> dict:
    return enumerate_decisions(lambda chooser: accept(tree, logits, params, mode, chooser=chooser).tokens)


def total_variation(a: dict[tuple[int, ...], float], b: dict[tuple[int, ...], float]) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


# ---------------------------------------------------------------------------------------------------- trees
def random_tree(seed: int, n: int, max_children: int = 3) -> Tree:
    """A random tree over the toy vocabulary with distinct sibling tokens and random draft log-probs."""
    g = torch.Generator().manual_seed(seed)
    tokens, parents = [ROOT], [-1]
    while len(tokens) < n:
        parent = int(torch.randint(len(tokens), (), generator=g))
        used = {tokens[c] for c in range(len(tokens)) if parents[c] == parent}
        if len(used) >= max_children:
            continue
        tokens.append(int(torch.tensor([t for t in range(V) if t not in used])[torch.randint(V - len(used), ())]))
        parents.append(parent)
    return Tree.from_lists(tokens, parents, (torch.randn(n, generator=g) - 1.0).tolist())


def guided_tree(depth: int, width: int, seed: int) -> Tree:
    """A full tree whose children are the toy target's top-`width` tokens (a forbidden one among them when fewer are
    allowed) and whose draft log-probs are the target's logits plus noise: deep paths get accepted, so internal nodes
    are entered with p~ < 1 and their residuals matter."""
    g = torch.Generator().manual_seed(seed)
    tokens, parents, logprobs = [ROOT], [-1], [0.0]
    frontier = [0]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            context = tuple(tokens[i] for i in Tree.from_lists(tokens, parents).path_to(node))
            logits = toy_logits(context)
            for token in torch.topk(logits, width).indices.tolist():
                noisy = logits[token].clamp(min=-3.0) + torch.randn((), generator=g)
                tokens, parents, logprobs = tokens + [token], parents + [node], logprobs + [noisy.item()]
                nxt.append(len(tokens) - 1)
        frontier = nxt
    return Tree.from_lists(tokens, parents, logprobs)


def zero_target_tree() -> Tree:
    """Drafts that carry tokens the toy target forbids (-inf logit, zero probability) at their parent."""
    banned = torch.isneginf(toy_logits((ROOT,))).nonzero().flatten().tolist()
    allowed = torch.isfinite(toy_logits((ROOT,))).nonzero().flatten().tolist()
    assert banned, "the toy target must forbid a token after the root for this tree"
    return Tree.from_lists([ROOT, banned[0], allowed[0], allowed[0]], [-1, 0, 0, 1], [-0.1, -2.0, -0.7, -0.3])


TREES = {
    "random7": random_tree(0, 7),
    "random6": random_tree(3, 6),
    "guided-binary": guided_tree(3, 2, 0),
    "guided-wide": guided_tree(2, 3, 1),
    "chain": Tree.chain([ROOT, 2, 0, 4], [0.0, -0.5, -0.2, -1.0]),
    "full-star": Tree.from_lists([ROOT, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 0, 0], [0.0, -1.0, -2.0, -0.5, -3.0, -1.5]),
    "zero-target": zero_target_tree(),
    "root-only": Tree.root_only(ROOT),
}


# ---------------------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("params", SAMPLING.values(), ids=SAMPLING.keys())
@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("mode", ["target_only", "traversal"])
def test_sampling_is_exactly_the_target(mode: str, tree: Tree, params: SamplingParams) -> None:
    outcomes = enumerate_acceptance(tree, tree_logits(tree), params, mode)
    assert sum(outcomes.values()) == pytest.approx(1.0, abs=1e-12)
    got, want = extend_to(outcomes, params, 3), target_sequence_dist(params, 3)
    assert total_variation(got, want) < 1e-12


@pytest.mark.parametrize("params", SAMPLING.values(), ids=SAMPLING.keys())
@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("mode", ["target_only", "traversal"])
def test_expected_acceptance_is_the_optimum_for_a_fixed_tree(mode: str, tree: Tree, params: SamplingParams) -> None:
    """Both rules accept the longest tree prefix of an exact target sample (a dropped child's token is never the
    bonus), so E[accepted drafts] = sum over drafted nodes v of p_target(path to v) (`expected_accepted`): the best any
    lossless rule can do on a fixed tree. Also an acceptance floor: speculation that silently accepts nothing fails."""
    outcomes = enumerate_acceptance(tree, tree_logits(tree), params, mode)
    got = sum(p * (len(tokens) - 1) for tokens, p in outcomes.items())
    unfiltered = params.top_k == 0 and params.top_p == 1  # computed in float32 (expected_accepted's fast path)
    assert got == pytest.approx(expected_accepted(tree, tree_logits(tree), params), abs=1e-6 if unfiltered else 1e-12)
    assert tree is not TREES["guided-binary"] or params is not SAMPLING["t1"] or got > 2.0


@pytest.mark.parametrize("tree", TREES.values(), ids=TREES.keys())
def test_expected_acceptance_at_temperature_zero_is_the_greedy_length(tree: Tree) -> None:
    logits = tree_logits(tree)
    assert expected_accepted(tree, logits, SamplingParams()) == accept(tree, logits).num_accepted


def test_expected_acceptance_fast_path_equals_the_float64_sum_at_vocabulary_size() -> None:
    """Unfiltered sampling reads only the rows of nodes with children, in float32: it must give the float64 sum of
    target_probs path products on a SmolLM2-sized vocabulary (a wrong row, token or temperature is far off)."""
    g = torch.Generator().manual_seed(0)
    vocab, parents = 49152, [-1] + [min(i - 1, int(torch.randint(0, 12, (), generator=g))) for i in range(1, 65)]
    tokens = [ROOT] + [int(t) for t in torch.randperm(vocab, generator=g)[:64]]  # distinct, so siblings are too
    tree = Tree.from_lists(tokens, parents)
    logits = 3 * torch.randn(65, vocab, generator=g)
    logits[torch.tensor(parents[1:]), torch.tensor(tokens[1:])] += 12  # drafts the target likes: paths of weight
    for temperature in (0.6, 1.0):
        params = SamplingParams(temperature=temperature)
        probs = target_probs(logits, params)
        reach = [1.0] * 65
        for v in range(1, 65):
            reach[v] = reach[parents[v]] * float(probs[parents[v], tokens[v]])
        assert sum(reach[1:]) > 0.5
        assert expected_accepted(tree, logits, params) == pytest.approx(sum(reach[1:]), rel=1e-5)


def test_expected_acceptance_rejects_mismatched_logits() -> None:
    tree = TREES["random7"]
    with pytest.raises(ValueError, match="one row per tree node"):
        expected_accepted(tree, tree_logits(tree)[:-1], SAMPLING["t1"])


def naive_token_rule(tree: Tree, logits: torch.Tensor, params: SamplingParams, chooser: ScriptedChooser) -> list[int]:
    """The plain min(1, p/q) rule with residual updates, children tried in index order (deterministic top-K tree)."""
    node, out = 0, []
    while True:
        p = target_probs(logits[node : node + 1], params)[0]
        kids = tree.children(node)
        q_all = torch.softmax(tree.draft_logprobs[kids].double(), 0)
        for c, q in zip(kids, q_all.tolist(), strict=True):
            token = int(tree.tokens[c])
            a = min(1.0, p[token].item() / q)
            if chooser.choose(torch.tensor([1 - a, a])) == 1:
                out.append(token)
                node = c
                break
            p = (p - torch.zeros(V, dtype=torch.float64).index_fill_(0, torch.tensor([token]), q)).clamp(min=0)
            p = p / p.sum()
        else:
            return out + [chooser.choose(p)]


def test_plain_min_rule_is_biased_on_deterministic_trees() -> None:
    tree, params = TREES["guided-binary"], SAMPLING["t1"]
    logits = tree_logits(tree)
    naive = enumerate_decisions(lambda chooser: naive_token_rule(tree, logits, params, chooser))
    want = target_sequence_dist(params, 2)
    assert total_variation(extend_to(naive, params, 2), want) > 0.05, "the plain rule should be visibly biased here"
    for mode in ("target_only", "traversal"):
        exact = extend_to(enumerate_acceptance(tree, logits, params, mode), params, 2)
        assert total_variation(exact, want) < 1e-12


@pytest.mark.parametrize("mode", ["target_only", "traversal"])
def test_seeded_draws_pass_chi_square(mode: str) -> None:
    tree, params, n = TREES["guided-binary"], SAMPLING["t1.3-topp0.8"], 2000
    logits, g = tree_logits(tree), torch.Generator().manual_seed(1234)
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(n):
        seq = tuple(accept(tree, logits, params, mode, g).tokens[:2])
        if len(seq) == 1:
            seq += (GeneratorChooser(g).choose(target_probs(toy_logits((ROOT, *seq))[None], params)[0]),)
        counts[seq] += 1
    want = target_sequence_dist(params, 2)
    assert all(want[s] > 0 for s in counts), "drew a continuation the target cannot produce"
    support = [s for s in want if want[s] > 0]
    assert chisquare([counts[s] for s in support], [n * want[s] for s in support]).pvalue > 1e-3


def test_same_seed_same_acceptance() -> None:
    tree, params = TREES["random7"], SAMPLING["t1"]
    logits = tree_logits(tree)
    runs = [
        [accept(tree, logits, params, "traversal", g).path for _ in range(20)]
        for g in (torch.Generator().manual_seed(7), torch.Generator().manual_seed(7))
    ]
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------------------------------------- greedy
def argmax_logits(argmax: list[int]) -> torch.Tensor:
    """[N, V] logits whose row i has its argmax at argmax[i] (and a -inf entry, which greedy must ignore)."""
    logits = torch.randn(len(argmax), V)
    logits[:, 0] = -math.inf
    logits[torch.arange(len(argmax)), argmax] = 10.0
    return logits


@pytest.mark.parametrize(
    ("tokens", "parents", "argmax", "path", "bonus"),
    [
        ([1, 2, 3, 4], [-1, 0, 1, 2], [2, 3, 4, 2], [0, 1, 2, 3], 2),  # chain, all accepted
        ([1, 2, 3, 4], [-1, 0, 1, 2], [3, 3, 4, 2], [0], 3),  # chain, none accepted
        ([1, 2, 3, 4], [-1, 0, 1, 2], [2, 4, 4, 2], [0, 1], 4),  # chain, stops midway
        ([1, 2, 3, 4], [-1, 0, 0, 0], [4, 1, 1, 2], [0, 3], 2),  # star (depth 1), last sibling
        ([1, 2, 3, 4, 2], [-1, 0, 0, 2, 3], [3, 1, 4, 2, 1], [0, 2, 3, 4], 1),  # branch taken is not node 1's
        ([1], [-1], [3], [0], 3),  # root only: one autoregressive step
    ],
    ids=["all-accept", "none-accept", "chain-partial", "star", "branchy", "root-only"],
)
def test_greedy_follows_argmax(tokens, parents, argmax, path, bonus) -> None:
    tree = Tree.from_lists(tokens, parents)
    acc = accept(tree, argmax_logits(argmax), SamplingParams(), "greedy")
    assert (acc.path, acc.bonus) == (path, bonus)
    assert acc.tokens == [tokens[i] for i in path[1:]] + [bonus]
    assert acc.num_accepted == len(path) - 1


@pytest.mark.parametrize("mode", ["target_only", "traversal"])
def test_temperature_zero_is_greedy_in_every_mode(mode: str) -> None:
    tree = TREES["random7"]
    logits = tree_logits(tree)
    want = accept(tree, logits, SamplingParams(), "greedy")
    assert accept(tree, logits, SamplingParams(top_k=2, top_p=0.5), mode) == want


# ---------------------------------------------------------------------------------------------------- filtering
def test_target_probs_matches_reference_filters() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -math.inf]])
    ref = torch.softmax(logits.double() / 0.5, -1)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=0.5)), ref, atol=1e-15)
    top2 = target_probs(logits, SamplingParams(temperature=0.5, top_k=2))
    assert torch.allclose(top2, torch.cat([ref[:, :2] / ref[0, :2].sum(), torch.zeros(1, 3, dtype=torch.float64)], 1))
    p = ref[0]
    # nucleus: keep the smallest prefix whose mass reaches top_p, so exactly 2 tokens when top_p = p0 + p1
    for top_p, kept in [((p[0] + p[1]).item(), 2), ((p[0] + p[1]).item() + 1e-6, 3), (1e-9, 1), (1.0, 4)]:
        probs = target_probs(logits, SamplingParams(temperature=0.5, top_p=top_p))[0]
        assert (probs > 0).sum().item() == kept, top_p
        assert torch.allclose(probs[:kept], p[:kept] / p[:kept].sum(), atol=1e-15)


def test_top_p_applies_after_temperature() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    hot = target_probs(logits, SamplingParams(temperature=10.0, top_p=0.5))
    cold = target_probs(logits, SamplingParams(temperature=0.1, top_p=0.5))
    assert (hot > 0).sum() == 2 and (cold > 0).sum() == 1


def test_target_probs_no_nan_on_finite_rows() -> None:
    logits = torch.tensor([[1e30, -1e30, -math.inf], [-math.inf, -math.inf, 3.0], [-1e4, -1e4 - 1, -math.inf]])
    for params in [*SAMPLING.values(), SamplingParams(temperature=1e-4), SamplingParams()]:
        probs = target_probs(logits, params)
        assert torch.isfinite(probs).all() and torch.allclose(probs.sum(-1), torch.ones(3, dtype=torch.float64))
        assert (probs[torch.isneginf(logits)] == 0).all()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (torch.tensor([[0.0, math.nan]]), "NaN"),
        (torch.tensor([[0.0, math.inf]]), r"\+inf"),
        (torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]), r"rows \[1\] are -inf everywhere"),
        (torch.zeros(3), r"shape \[N, V\]"),
    ],
    ids=["nan", "posinf", "all-neginf", "1d"],
)
def test_target_probs_rejects_bad_logits(bad: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        target_probs(bad, SamplingParams(temperature=1.0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_sampling_params_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


# ---------------------------------------------------------------------------------------------------- bad input
def test_accept_rejects_bad_input() -> None:
    tree = Tree.from_lists([1, 2, 3], [-1, 0, 0])
    logits = torch.randn(3, V)
    hot = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match="unknown acceptance mode"):
        accept(tree, logits, hot, "beam", torch.Generator())
    with pytest.raises(ValueError, match=r"shape \[N=3, V\]"):
        accept(tree, logits[:2], hot, "traversal", torch.Generator())
    with pytest.raises(TreeError, match=r"\[0, 3\)"):
        accept(tree, logits[:, :3], hot, "traversal", torch.Generator())
    with pytest.raises(TreeError, match="siblings must be distinct"):
        accept(Tree.from_lists([1, 2, 2], [-1, 0, 0]), logits, hot, "traversal", torch.Generator())
    with pytest.raises(ValueError, match="needs temperature 0"):
        accept(tree, logits, hot, "greedy", torch.Generator())
    with pytest.raises(ValueError, match="seeded torch.Generator"):
        accept(tree, logits, hot, "target_only")
    with pytest.raises(ValueError, match="NaN"):
        accept(tree, logits.index_fill(1, torch.tensor([2]), math.nan), SamplingParams(), "greedy")


# ---------------------------------------------------------------------------------------------------- EOS
@pytest.mark.parametrize(
    ("tokens", "eos", "want"),
    [
        ([5, 6, 7], {9}, ([5, 6, 7], False)),
        ([5, 9, 7, 9], {9}, ([5, 9], True)),
        ([9], [9, 2], ([9], True)),
        ([5, 6, 2], (9, 2), ([5, 6, 2], True)),
        ([5, 6], (), ([5, 6], False)),
    ],
)
def test_truncate_at_eos(tokens, eos, want) -> None:
    assert truncate_at_eos(tokens, eos) == want
