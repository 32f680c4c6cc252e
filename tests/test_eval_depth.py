"""Figure-4 measurement (weaver.eval_depth) on a tiny random target, drafter and adapter."""

from __future__ import annotations

import csv

import pytest
import torch
from tiny_models import tiny_adapter, tiny_drafter, tiny_hf_model

from weaver.adapter import candidate_pools
from weaver.builders import build_tree
from weaver.drafter import DraftBlock, Drafter, DrafterConfig, build_target_layer_ids
from weaver.eval_depth import (
    ORACLE,
    POOL_BOUND,
    TREE_FIELDS,
    TreeSpec,
    accepted_drafts,
    adapter_paths,
    best_tree_accepted,
    build_parser,
    check_tree_args,
    draft_sequence,
    evaluate,
    pick_anchors,
    rows_for,
    sequence_acceptance,
    tree_acceptance,
    tree_expected_acceptance,
    tree_rows_for,
    write_csv,
)
from weaver.models import from_hf_model
from weaver.sampling import SamplingParams, target_probs
from weaver.tree import Tree
from weaver.verify import expected_accepted


@pytest.fixture(scope="module")
def setup() -> tuple:
    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model("llama")).eval()
    cfg = model.config
    drafter = Drafter(
        DrafterConfig(
            block_size=6,
            target_layer_ids=build_target_layer_ids(cfg.num_hidden_layers, 1),
            mask_token_id=0,
            hidden_size=cfg.hidden_size,
            num_layers=1,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=96,
            vocab_size=cfg.vocab_size,
            num_target_layers=cfg.num_hidden_layers,
        )
    ).eval()
    with torch.no_grad():  # sharper marginals than the random init gives, so argmax and sample differ clearly
        drafter.norm.weight.mul_(8.0)
    return model, drafter


def sequence(length: int = 20) -> torch.Tensor:
    return torch.randint(1, 97, (length,), generator=torch.Generator().manual_seed(5))


def test_matches_per_anchor_drafts_against_the_dense_target(setup) -> None:
    """Reference: Drafter.draft from a cache of the context x_<L, and the target's softmax at L + d - 1."""
    model, drafter = setup
    ids, anchors = sequence(), [4, 9, 17]
    acc = sequence_acceptance(model, drafter, None, ids, anchors, temperature=1.0)
    with torch.no_grad():
        out = model(ids[None], hidden_layers=drafter.hidden_layers)
    p_all = torch.softmax(out.logits[0].double(), -1)
    for row, anchor in enumerate(anchors):
        cache = drafter.new_cache()
        drafter.extend(cache, out.hidden[0, :anchor])
        with torch.no_grad():
            block = drafter.draft(cache, int(ids[anchor]), model.embed_tokens, model.lm_head)
        for d in range(1, drafter.cfg.block_size):
            if anchor + d - 1 >= ids.numel():
                assert not acc["valid"][row, d - 1]
                continue
            p, q = p_all[anchor + d - 1], torch.softmax(block.logits[d - 1].double(), -1)
            assert acc["valid"][row, d - 1]
            assert acc["argmax"][row, d - 1].item() == pytest.approx(p[q.argmax()].item(), rel=1e-4)
            assert acc["sample"][row, d - 1].item() == pytest.approx((p * q).sum().item(), rel=1e-4)


def test_zero_residual_weaver_over_the_full_vocabulary_is_the_marginal(setup) -> None:
    model, drafter = setup
    adapter = tiny_adapter(model, pool_size=model.config.vocab_size, residual=0.0)
    acc = sequence_acceptance(model, drafter, adapter, sequence(), [5, 11], temperature=1.0)
    torch.testing.assert_close(acc["weaver_argmax"], acc["argmax"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(acc["weaver_sample"], acc["sample"], rtol=1e-4, atol=1e-6)
    trained = tiny_adapter(model, pool_size=16, residual=0.5)
    moved = sequence_acceptance(model, drafter, trained, sequence(), [5, 11], temperature=1.0)
    assert not torch.allclose(moved["weaver_sample"], acc["sample"])


def test_greedy_target_scores_argmax_as_a_hit_or_a_miss(setup) -> None:
    model, drafter = setup
    acc = sequence_acceptance(model, drafter, None, sequence(), [3, 8], temperature=0.0)
    hits = acc["argmax"][acc["valid"]]
    assert set(hits.unique().tolist()) <= {0.0, 1.0}
    assert (acc["sample"] <= 1.0 + 1e-6).all() and (acc["sample"] >= 0).all()


def test_anchors_lie_in_the_continuation() -> None:
    gen = torch.Generator().manual_seed(0)
    anchors = pick_anchors(prompt_len=6, length=12, count=50, generator=gen)
    assert anchors == list(range(5, 11))
    assert pick_anchors(prompt_len=6, length=6, count=4, generator=gen) == []


def test_evaluate_writes_one_row_per_draft_and_depth(setup, tmp_path) -> None:
    model, drafter = setup
    adapter = tiny_adapter(model, pool_size=16, residual=0.5)
    prompts = [sequence(7).tolist(), sequence(9).tolist()]
    result = evaluate(model, drafter, adapter, prompts, 1.0, max_new_tokens=10, anchors_per_seq=4, eos_id=None)
    rows = rows_for("tiny", "synthetic", 1.0, result)
    assert {r.draft for r in rows} == {"argmax", "sample", "weaver_argmax", "weaver_sample"}
    assert {r.depth for r in rows} == set(range(1, drafter.cfg.block_size))
    assert all(0.0 <= r.acceptance <= 1.0 and r.n > 0 for r in rows)
    write_csv(tmp_path / "depth.csv", rows)
    with (tmp_path / "depth.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and float(table[0]["acceptance"]) == pytest.approx(rows[0].acceptance)


def test_trees_accept_what_the_engine_accepts_at_temperature_0() -> None:
    """Teacher-forced tree acceptance at the engine's own step roots equals the engine's accepted drafts, step by
    step, for every drafter-based builder (the estimator is exact at temperature 0, not a proxy). The GDN hybrid's
    greedy continuation varies (the tiny random llama's repeats one token) and its engine verifies trees with the
    rollback-free GDN path, so a mis-aligned truth or a tree-verify mismatch shows up here."""
    from weaver.generate import generate
    from weaver.sources import make_source

    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model("qwen3_next")).eval()
    drafter = tiny_drafter(model)
    bound = tiny_adapter(model, pool_size=32).bind(model.embed_tokens.weight, model.lm_head.weight, children=4)
    prompt, budget, depth = sequence(9).tolist(), 32, drafter.cfg.block_size - 1
    accepted = 0
    for method in ("chain", "ddtree", "weaver", "weaver_chain"):
        adapter = bound if method.startswith("weaver") else None
        source = make_source(method, model, drafter=drafter, adapter=adapter)
        out = generate(model, prompt, source=source, budget=budget, max_new_tokens=40)
        ids = torch.tensor(prompt + out.output_ids)
        roots = [len(prompt)]  # step k is rooted at its first uncommitted token x_L
        for length in out.stats.accept_lengths[:-1]:
            roots.append(roots[-1] + length)
        steps = [(r, a) for r, a in zip(roots, out.stats.accept_lengths, strict=True) if r + depth < ids.numel()]
        drafts = draft_sequence(model, drafter, ids, [r for r, _ in steps])
        got = tree_acceptance(drafts, (method,), budget, adapter)[method]
        assert got.tolist() == [a - 1 for _, a in steps], method
        accepted += int(got.sum())
    assert len(set(ids.tolist())) > 5 and accepted > 0  # varied truth, accepted paths as well as misses


def test_chain_tree_accepts_the_leading_argmax_hits(setup) -> None:
    model, drafter = setup
    ids, anchors = sequence(30), [3, 8, 12, 20]
    drafts = draft_sequence(model, drafter, ids, anchors)
    acc = sequence_acceptance(model, drafter, None, ids, anchors, temperature=0.0, drafts=drafts)
    chain = tree_acceptance(drafts, ("chain",), budget=64, adapter=None)["chain"]
    for row in range(len(anchors)):
        hits = acc["argmax"][row].tolist()
        leading = hits.index(0.0) if 0.0 in hits else len(hits)
        assert chain[row] == leading


def test_drafts_of_another_sequence_are_refused(setup) -> None:
    model, drafter = setup
    ids = sequence(30)
    drafts = draft_sequence(model, drafter, ids, [3, 8])
    with pytest.raises(ValueError, match="other ids or anchors"):
        sequence_acceptance(model, drafter, None, ids, [3, 9], temperature=0.0, drafts=drafts)
    with pytest.raises(ValueError, match="other ids or anchors"):
        sequence_acceptance(model, drafter, None, ids.flip(0), [3, 8], temperature=0.0, drafts=drafts)


def test_weaver_trees_stay_within_the_pool_bound(setup) -> None:
    model, drafter = setup
    embed, lm_head = model.embed_tokens.weight, model.lm_head.weight
    ids, anchors = sequence(30), list(range(2, 24, 3))
    drafts = draft_sequence(model, drafter, ids, anchors)
    narrow = tiny_adapter(model, pool_size=4, residual=0.5).bind(embed, lm_head, children=4)
    result = tree_acceptance(drafts, ("weaver", "weaver_chain"), budget=16, adapter=narrow)
    assert (result["weaver"] <= result[POOL_BOUND]).all() and (result["weaver_chain"] <= result[POOL_BOUND]).all()
    assert result[POOL_BOUND].sum() < len(anchors) * (drafter.cfg.block_size - 1)  # a 4-token pool misses somewhere
    full = tiny_adapter(model, pool_size=model.config.vocab_size, residual=0.5).bind(embed, lm_head)
    bound = tree_acceptance(drafts, (), budget=16, adapter=full)[POOL_BOUND]
    assert bound.tolist() == [len(drafts.truth(row)) for row in range(len(anchors))]  # every token is in the pool


def test_accepted_drafts_walks_the_matching_branch() -> None:
    #        0:root -> 1:a(5) -> 3:c(7)
    #               -> 2:b(6) -> 4:d(8) -> 5:e(9)
    tree = Tree.from_lists([1, 5, 6, 7, 8, 9], [-1, 0, 0, 1, 2, 4], [0.0] * 6)
    assert accepted_drafts(tree, [6, 8, 9, 4]) == 3
    assert accepted_drafts(tree, [5, 8]) == 1
    assert accepted_drafts(tree, [4]) == 0
    assert accepted_drafts(tree, []) == 0


def test_evaluate_adds_tree_rows_at_every_temperature(setup, tmp_path) -> None:
    model, drafter = setup
    embed, lm_head = model.embed_tokens.weight, model.lm_head.weight
    spec = TreeSpec(("chain", "ddtree", "weaver"), 16, tiny_adapter(model, 16, 0.5).bind(embed, lm_head, children=4))
    prompts = [sequence(7).tolist(), sequence(9).tolist()]
    rows = []
    for temperature in (0.0, 1.0):
        result = evaluate(model, drafter, None, prompts, temperature, 10, anchors_per_seq=4, eos_id=None, trees=spec)
        rows += tree_rows_for("tiny", "synthetic", temperature, spec, result)
        assert all(r.n == int(result["tree_n"]) > 0 for r in rows if r.temperature == temperature)
    # the pool bound is a temperature-0 quantity (the longest prefix of one continuation)
    assert [(r.temperature, r.method) for r in rows] == [
        (0.0, "chain"),
        (0.0, "ddtree"),
        (0.0, "weaver"),
        (0.0, POOL_BOUND),
        (1.0, "chain"),
        (1.0, "ddtree"),
        (1.0, "weaver"),
    ]
    assert all(r.tau >= 1.0 and r.budget == 16 for r in rows)
    assert (
        evaluate(model, drafter, None, prompts, 1.0, 10, anchors_per_seq=4, eos_id=None)
        .keys()
        .isdisjoint({"tree_n", "tree:chain"})
    )
    write_csv(tmp_path / "trees.csv", rows, TREE_FIELDS)
    with (tmp_path / "trees.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [(float(row["temperature"]), row["method"]) for row in table] == [(r.temperature, r.method) for r in rows]


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_expected_tree_acceptance_matches_dense_forwards_of_every_node(family: str) -> None:
    """At temperature > 0 each tree is verified on a cache walked anchor to anchor; the reference runs the target
    without a cache on x_<L followed by each node's root path, so a cache that lags or leads the anchor, or a GDN
    state carried across anchors wrongly, changes the scores."""
    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model(family)).eval()
    drafter = tiny_drafter(model)
    bound = tiny_adapter(model, pool_size=16, residual=0.5).bind(model.embed_tokens.weight, model.lm_head.weight)
    ids, anchors, budget = sequence(24), [9, 10, 15, 20], 8
    params = SamplingParams(temperature=1.0)
    drafts = draft_sequence(model, drafter, ids, anchors)
    got = tree_expected_acceptance(model, drafts, ("ddtree", "weaver"), budget, bound, params)
    for row, anchor in enumerate(anchors):
        block = DraftBlock(drafts.logits[row], drafts.proposal[row], drafts.target_hidden[row])
        for name in ("ddtree", "weaver"):
            tree = build_tree(name, block, int(ids[anchor]), budget, adapter=bound)
            with torch.no_grad():
                logits = torch.stack(
                    [
                        model(torch.cat([ids[:anchor], tree.tokens[tree.path_to(v)]])[None]).logits[0, -1]
                        for v in range(tree.num_nodes)
                    ]
                )
            assert got[name][row].item() == pytest.approx(expected_accepted(tree, logits, params), rel=1e-4, abs=1e-7)
    assert (got["ddtree"] > 0).all()


def test_expected_tree_acceptance_at_temperature_0_is_the_greedy_walk() -> None:
    """On the target's own greedy continuation, the verified trees' one-hot expectation equals the truth walk."""
    from weaver.generate import generate

    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model("qwen3_next")).eval()
    drafter = tiny_drafter(model)
    bound = tiny_adapter(model, pool_size=32).bind(model.embed_tokens.weight, model.lm_head.weight, children=4)
    prompt = sequence(9).tolist()
    ids = torch.tensor(prompt + generate(model, prompt, max_new_tokens=30).output_ids)
    anchors = list(range(len(prompt), ids.numel() - drafter.cfg.block_size, 3))
    drafts = draft_sequence(model, drafter, ids, anchors)
    methods = ("chain", "ddtree", "weaver")
    walk = tree_acceptance(drafts, methods, 16, bound)
    verified = tree_expected_acceptance(model, drafts, methods, 16, bound, SamplingParams())
    for name in methods:
        assert verified[name].tolist() == walk[name].tolist(), name
    assert sum(float(walk[name].sum()) for name in methods) > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trees", "ddtree"], "--trees-out"),
        (["--trees-out", "t.csv"], "needs --trees"),
        (["--oracle"], "--oracle needs --trees"),
        (["--trees", "ddtree", "--trees-out", "t.csv", "--pool-size", "256"], "needs --adapter"),
        (["--trees", "ddtree", "--trees-out", "t.csv", "--adapter", "a.pt", "--pool-size", "0"], ">= 1"),
        (["--trees", "weaver", "--trees-out", "t.csv"], "--adapter"),
        (["--trees", "weaver", "--trees-out", "t.csv", "--adapter-at", "1", "a1.pt"], "none at 0"),
        (["--adapter-at", "0.5", "a.pt"], "not one of --temperatures 1 0"),
        (["--adapter-at", "warm", "a.pt"], "'warm' is not a temperature"),
        (["--adapter-at", "1", "a.pt", "--adapter-at", "1.0", "b.pt"], "given twice"),
    ],
)
def test_tree_options_are_checked_before_loading(argv, message) -> None:
    args = build_parser().parse_args(["--model", "m", "--drafter", "d", "--out", "o.csv", *argv])
    with pytest.raises(SystemExit, match=message):
        check_tree_args(args)


def best_paths_reference(model, context, budget, depth_cap, params, pools=None) -> float:
    """Sum of the `budget` largest path probabilities over paths of depth <= depth_cap, by dense forwards without a
    cache. A path among the best has every prefix among the best, so expanding each depth's best `budget` suffices."""
    level, found = [((), 1.0)], []
    for depth in range(depth_cap):
        grown = []
        for path, reach in level:
            with torch.no_grad():
                logits = model(torch.tensor([*context, *path])[None]).logits[0, -1:]
            probs = target_probs(logits, params)[0]
            if pools is not None:
                allowed = pools[depth][pools[depth] >= 0]
                probs = torch.zeros_like(probs).index_copy_(0, allowed, probs[allowed])
            top = probs.topk(budget)
            grown += [
                ((*path, t), reach * p) for p, t in zip(top.values.tolist(), top.indices.tolist(), strict=True) if p > 0
            ]
        found += grown
        level = sorted(grown, key=lambda x: -x[1])[:budget]
    return sum(sorted((p for _, p in found), reverse=True)[:budget])


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_best_tree_is_the_most_probable_paths(family: str) -> None:
    """The oracle's best-first over cached tree verifies (with lookahead leaves) equals a dense enumeration, with and
    without pools; every builder's tree scores at most the oracle, and a Weaver tree at most its pools' bound."""
    torch.manual_seed(0)
    model = from_hf_model(tiny_hf_model(family)).eval()
    drafter = tiny_drafter(model)
    ids, anchor, budget, depth_cap = sequence(16), 9, 10, 4
    params = SamplingParams(temperature=0.5)
    drafts = draft_sequence(model, drafter, ids, [anchor])
    pools = candidate_pools(drafts.logits[0], 4).ids
    cache = model.new_cache(max_seq_len=ids.numel(), max_tree_nodes=64)
    model(ids[None, :anchor], cache=cache)
    root, context = int(ids[anchor]), ids[: anchor + 1].tolist()
    for restrict in (None, pools):
        got = best_tree_accepted(model, cache, root, budget, depth_cap, params, restrict)
        assert got == pytest.approx(best_paths_reference(model, context, budget, depth_cap, params, restrict), rel=1e-5)
    assert cache.seq_len == anchor and cache.pending is None  # the oracle leaves the cache as it found it

    bound = tiny_adapter(model, pool_size=4, residual=0.5).bind(model.embed_tokens.weight, model.lm_head.weight)
    scores = tree_expected_acceptance(model, drafts, ("chain", "ddtree", "weaver"), budget, bound, params, oracle=True)
    assert all(scores[name][0] <= scores[ORACLE][0] + 1e-9 for name in ("chain", "ddtree", "weaver", POOL_BOUND))
    assert scores["weaver"][0] <= scores[POOL_BOUND][0] + 1e-9
    assert scores[POOL_BOUND][0] < scores[ORACLE][0]  # 4-token pools miss mass


def test_adapter_at_replaces_the_adapter_at_its_temperature_only() -> None:
    parse = build_parser().parse_args
    base = ["--model", "m", "--drafter", "d", "--out", "o.csv", "--temperatures", "0", "1"]
    given = parse([*base, "--adapter", "a.pt", "--adapter-at", "1", "a1.pt"])
    assert adapter_paths(given) == {0.0: "a.pt", 1.0: "a1.pt"}
    assert adapter_paths(parse([*base, "--adapter-at", "1", "a1.pt"])) == {0.0: None, 1.0: "a1.pt"}
    trees = ["--trees", "weaver", "--trees-out", "t.csv"]
    both = parse([*base, "--adapter-at", "0", "a0.pt", "--adapter-at", "1", "a1.pt", *trees])
    check_tree_args(both)  # every temperature has its adapter: no --adapter needed
    assert adapter_paths(both) == {0.0: "a0.pt", 1.0: "a1.pt"}


def test_main_scores_each_temperature_with_its_adapter(setup, tmp_path, monkeypatch) -> None:
    """The command's wiring: the weaver rows and trees at temperature 1 come from --adapter-at 1's checkpoint, those at
    0 from --adapter's (told apart by their pool sizes), each file loaded once."""
    import weaver.data
    import weaver.drafter
    import weaver.eval_depth as eval_depth
    import weaver.models
    from weaver.adapter import Weaver

    model, drafter = setup
    tiny_adapter(model, pool_size=8).save(tmp_path / "a.pt")
    tiny_adapter(model, pool_size=12).save(tmp_path / "a1.pt")
    tokenizer = type("Tokenizer", (), {"eos_token_id": None})()
    monkeypatch.setattr(weaver.models, "load_target", lambda name: (model, tokenizer))
    monkeypatch.setattr(weaver.drafter, "load_drafter", lambda path: drafter)
    monkeypatch.setattr(weaver.data, "load_prompts", lambda dataset, n, seed: [dataset])
    monkeypatch.setattr(weaver.data, "format_prompt", lambda tokenizer, prompt: [1, 2, 3])
    loads, seen = [], {}
    real_load = Weaver.load
    monkeypatch.setattr(Weaver, "load", classmethod(lambda cls, path: loads.append(path) or real_load(path)))

    def fake_evaluate(model, drafter, adapter, prompts, temperature, *args):
        spec = args[-1]
        seen[temperature] = (adapter.config.candidate_pool_size, spec.adapter.pool_size)
        return {"n": torch.zeros(drafter.cfg.block_size - 1)}

    monkeypatch.setattr(eval_depth, "evaluate", fake_evaluate)
    eval_depth.main(
        ["--model", "m", "--drafter", "d", "--adapter", str(tmp_path / "a.pt"), "--adapter-at", "1",
         str(tmp_path / "a1.pt"), "--temperatures", "1", "0", "--dataset", "mt_bench", "humaneval", "--trees",
         "weaver", "--trees-out", str(tmp_path / "t.csv"), "--out", str(tmp_path / "d.csv")]
    )  # fmt: skip
    assert seen == {1.0: (12, 12), 0.0: (8, 8)}
    assert sorted(loads) == [str(tmp_path / "a.pt"), str(tmp_path / "a1.pt")]
