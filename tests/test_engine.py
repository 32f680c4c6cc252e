"""The engine is lossless: speculative output == plain decoding (greedy) and == the target's distribution (sampling).

Covers every tree source (prompt lookup, oracle = all-accept, random = none-accept, and the drafter-based chain,
ddtree, weaver, weaver_chain with untrained drafters), budgets 0 (no draft at all) to 16, attention-only and GDN
hybrid targets, EOS inside an accepted path, an acceptance-length floor, and clear errors on bad input.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from scipy import stats as scipy_stats
from tiny_models import tiny_adapter, tiny_drafter, tiny_hf_model

from weaver.adapter import Weaver
from weaver.drafter import Drafter
from weaver.generate import generate
from weaver.models import from_hf_model
from weaver.sources import make_source
from weaver.tree import Tree
from weaver.verify import SamplingParams

FAMILIES = ("llama", "qwen3", "qwen3_next", "qwen3_5_text")
NEW = 24


@pytest.fixture(scope="module")
def targets() -> dict:
    torch.manual_seed(0)
    return {fam: from_hf_model(tiny_hf_model(fam)) for fam in FAMILIES}


def _prompt(seed: int = 1, length: int = 12) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(3, 97, (length,), generator=g).tolist()
    return base + base[: length // 2]  # a repeat so that prompt lookup finds matches


def _drafter_and_adapter(model) -> tuple[Drafter, Weaver]:
    return tiny_drafter(model), tiny_adapter(model)


def _source(method: str, model, drafter=None, adapter=None):
    if method in ("chain", "ddtree", "weaver", "weaver_chain"):
        return make_source(method, model, drafter=drafter, adapter=adapter if method.startswith("weaver") else None)
    return make_source(method, model)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_speculation_equals_plain_decoding(targets, family) -> None:
    model = targets[family]
    prompt = _prompt()
    reference = generate(model, prompt, max_new_tokens=NEW).output_ids
    drafter, adapter = _drafter_and_adapter(model)
    methods = ("prompt_lookup", "oracle", "random", "chain", "ddtree", "weaver", "weaver_chain")
    for method in methods:
        for budget in (0, 1, 4, 16):
            source = _source(method, model, drafter, adapter)
            out = generate(model, prompt, source=source, budget=budget, max_new_tokens=NEW)
            assert out.output_ids == reference, f"{family}/{method}/budget {budget} diverged from greedy decoding"
            assert len(out.stats.accept_lengths) == out.stats.steps - 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (kernels/gpu_check.sh runs this on a GPU)")
@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_greedy_speculation_on_cuda_equals_plain_decoding(family) -> None:
    """Target, drafter and adapter on CUDA (GDN tree verify through the Triton kernels, Weaver steps through the
    Triton step kernels): every method's greedy output equals plain decoding on CUDA, which equals the CPU run's, and
    the Engine moves its checkpoints to the device it is given."""
    from weaver.backends.engine import Engine, EngineConfig

    hf = tiny_hf_model(family)  # fresh twins: a used model holds packed CPU weights that cannot be deep-copied
    cpu_model, model = from_hf_model(hf), from_hf_model(hf).cuda()
    drafter, adapter = tiny_drafter(cpu_model).cuda(), tiny_adapter(cpu_model).cuda()
    prompt = _prompt()
    reference = generate(model, prompt, max_new_tokens=NEW).output_ids
    assert reference == generate(cpu_model, prompt, max_new_tokens=NEW).output_ids
    for method in ("prompt_lookup", "oracle", "random", "chain", "ddtree", "weaver", "weaver_chain"):
        for budget in (4, 16):
            out = generate(
                model, prompt, source=_source(method, model, drafter, adapter), budget=budget, max_new_tokens=NEW
            )
            assert out.output_ids == reference, (
                f"{family}/{method}/budget {budget} on CUDA diverged from greedy decoding"
            )
    engine = Engine(EngineConfig("tiny", "oracle", 4, device="cuda"), from_hf_model(hf))
    assert engine.model.embed_tokens.weight.is_cuda
    assert engine.generate(prompt, max_new_tokens=NEW).output_ids == reference


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_speculation_at_the_end_of_the_context_equals_plain_decoding(targets, family) -> None:
    """A prompt that ends near the context limit: trees are cut to the positions left (a chain of 15 drafts would
    otherwise reach past the context), and the output still equals greedy decoding up to the last position."""
    model = targets[family]
    context = model.config.max_position_embeddings
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 97, (context - 12,), generator=g).tolist()
    reference = generate(model, prompt, max_new_tokens=13).output_ids  # 13 - 1 new positions: exactly the context
    drafter, adapter = _drafter_and_adapter(model)
    for method in ("oracle", "random", "prompt_lookup", "chain", "ddtree", "weaver", "weaver_chain"):
        out = generate(model, prompt, source=_source(method, model, drafter, adapter), budget=16, max_new_tokens=13)
        assert out.output_ids == reference, f"{family}/{method} diverged at the end of the context"
    with pytest.raises(ValueError, match="exceeds the model's context"):
        generate(model, prompt, max_new_tokens=14)


def test_truncate_keeps_a_valid_prefix_closed_tree() -> None:
    tree = Tree.from_lists([9, 1, 2, 3, 4, 5, 6], [-1, 0, 0, 1, 3, 2, 5], [0.0, -1, -2, -3, -4, -5, -6])
    cut = tree.truncate(2)
    assert cut.tokens.tolist() == [9, 1, 2, 3, 5] and cut.parents.tolist() == [-1, 0, 0, 1, 2]
    assert cut.draft_logprobs.tolist() == [0.0, -1, -2, -3, -5] and cut.depths.max() == 2
    cut.validate(depth_cap=2)
    assert tree.truncate(3) is tree and tree.truncate(0).num_nodes == 1


def test_random_source_stops_when_every_node_is_full(targets) -> None:
    """Budget above what the depth cap and vocabulary allow: the random tree stops growing instead of looping."""
    from weaver.sources import RandomSource

    source = RandomSource(targets["llama"], depth_cap=1)
    source.vocab_size = 3
    tree = source.build(None, 0, 8, torch.Generator().manual_seed(0))
    assert sorted(tree.tokens[1:].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_acceptance_floor_all_accept_and_none_accept(targets, family) -> None:
    """The oracle (drafter = target) accepts every draft; a random tree accepts (almost) none."""
    model = targets[family]
    oracle = generate(model, _prompt(), source=make_source("oracle", model), budget=4, max_new_tokens=NEW)
    assert oracle.stats.accept_lengths[:-1] == [5] * (len(oracle.stats.accept_lengths) - 1)
    assert oracle.stats.tau >= 4.0
    rand = generate(model, _prompt(), source=make_source("random", model), budget=8, max_new_tokens=NEW)
    assert rand.stats.tau < 1.3


def test_eos_inside_accepted_path_ends_generation(targets) -> None:
    model = targets["llama"]
    prompt = _prompt()
    reference = generate(model, prompt, max_new_tokens=NEW).output_ids
    eos = reference[5]
    cut = reference[: reference.index(eos) + 1]
    for budget in (0, 8):
        source = make_source("oracle", model) if budget else None
        out = generate(model, prompt, source=source, budget=budget, max_new_tokens=NEW, eos_ids=[eos])
        assert out.output_ids == cut
        assert out.stats.hit_eos


@pytest.mark.parametrize("mode", ["target_only", "traversal"])
def test_sampling_matches_target_distribution(targets, mode) -> None:
    """Joint law of the first two tokens: speculative samples vs the exact autoregressive law (chi-square)."""
    model = targets["qwen3_next"]
    prompt = _prompt(seed=4, length=6)
    params = SamplingParams(temperature=0.7, top_k=3)
    from weaver.sampling import target_probs

    with torch.no_grad():
        p1 = target_probs(model(torch.tensor([prompt])).logits[0, -1:].double(), params)[0]
        exact: dict[tuple[int, int], float] = {}
        for t1 in p1.nonzero().flatten().tolist():
            p2 = target_probs(model(torch.tensor([prompt + [t1]])).logits[0, -1:].double(), params)[0]
            for t2 in p2.nonzero().flatten().tolist():
                exact[(t1, t2)] = float(p1[t1] * p2[t2])
    draws = 300
    counts = dict.fromkeys(exact, 0)
    for seed in range(draws):
        out = generate(
            model, prompt, source=make_source("oracle", model), budget=3, max_new_tokens=2,
            params=params, mode=mode, seed=seed,
        )  # fmt: skip
        counts[tuple(out.output_ids)] += 1  # a KeyError here = a token outside the filtered support
    cells = sorted(exact)
    observed = [counts[c] for c in cells]
    expected = [exact[c] * draws for c in cells]
    assert scipy_stats.chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_expected_accept_lengths_are_the_accept_lengths_at_temperature_0(targets, family) -> None:
    model = targets[family]
    drafter, adapter = _drafter_and_adapter(model)
    for method in ("oracle", "prompt_lookup", "ddtree", "weaver"):
        stats = generate(
            model, _prompt(), source=_source(method, model, drafter, adapter), budget=8, expected=True
        ).stats
        assert stats.expected_accept_lengths == [float(a) for a in stats.accept_lengths], method
        assert stats.tau_expected == stats.tau
    assert max(generate(model, _prompt(), source=make_source("oracle", model), budget=8).stats.accept_lengths) > 1
    ar = generate(model, _prompt(), max_new_tokens=NEW, expected=True).stats
    assert ar.expected_accept_lengths == [1.0] * len(ar.accept_lengths)
    plain = generate(model, _prompt(), source=make_source("oracle", model), budget=8).stats
    assert plain.expected_accept_lengths is None and plain.tau_expected is None  # off unless asked for


def test_expected_accept_lengths_are_the_mean_of_the_sampled_ones(targets) -> None:
    """Each step's accept length minus its expectation has mean zero given the steps before it, so over many seeds
    the per-request sums of the differences average to zero (tau_expected then has tau's expectation)."""
    model = targets["llama"]
    noise, spread = [], []
    for seed in range(120):
        out = generate(
            model, _prompt(seed=4, length=6), source=make_source("oracle", model), budget=4, max_new_tokens=8,
            params=SamplingParams(temperature=0.2), seed=seed, expected=True,
        )  # fmt: skip
        stats = out.stats
        noise.append(sum(stats.accept_lengths) - sum(stats.expected_accept_lengths))
        spread.append(stats.tau - stats.tau_expected)
    mean, sd = float(torch.tensor(noise).mean()), float(torch.tensor(noise).std())
    assert sd > 0.3  # sampled accept lengths do differ from their expectations
    assert abs(mean) < 4 * sd / len(noise) ** 0.5
    assert max(map(abs, spread)) > 0.01


def test_bad_inputs_get_clear_errors(targets) -> None:
    model = targets["llama"]
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(model, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        generate(model, [1] * 500, max_new_tokens=100)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        generate(model, [1, 2], source=make_source("oracle", model), budget=-1)
    with pytest.raises(ValueError, match="vocabulary"):
        generate(model, [1, 2, 500], max_new_tokens=4)

    class OutOfVocab:  # a drafter built for another tokenizer
        name, hidden_layers = "bad", ()

        def begin(self, prompt_ids, hidden):
            pass

        def observe(self, tokens, hidden):
            pass

        def draft(self, root, generator):
            return None

        def build(self, draft, root, budget, generator):
            return Tree.chain([root, 1000])

    with pytest.raises(ValueError, match="vocab"):
        generate(model, [1, 2], source=OutOfVocab(), budget=1, max_new_tokens=4)


def test_nan_logits_are_refused() -> None:
    model = from_hf_model(tiny_hf_model("llama"))
    with torch.no_grad():
        model.lm_head.weight[5].fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        generate(model, [1, 2, 3], source=make_source("oracle", model), budget=2, max_new_tokens=4)


def test_drafter_vocab_mismatch_is_refused(targets) -> None:
    model = targets["llama"]
    drafter, _ = _drafter_and_adapter(targets["qwen3"])
    drafter.cfg = type(drafter.cfg)(**{**drafter.cfg.__dict__, "vocab_size": 50})
    with pytest.raises(ValueError, match="vocabulary"):
        make_source("chain", model, drafter=drafter)


@pytest.mark.slow
def test_smollm2_greedy_speculation_and_cli() -> None:
    """The real pretrained target: prompt lookup and the oracle reproduce greedy decoding; the CLI prints JSON."""
    from weaver.models import load_target

    model, tokenizer = load_target("smollm2-135m")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat after me: the cat sat on the mat, the cat sat on the mat."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    reference = generate(model, prompt, max_new_tokens=20).output_ids
    for method, budget in (("prompt_lookup", 8), ("oracle", 4)):
        out = generate(model, prompt, source=make_source(method, model), budget=budget, max_new_tokens=20)
        assert out.output_ids == reference, method
        assert out.stats.tau > 1.5, f"{method} accepted nothing: speculation silently disabled?"
    cli = subprocess.run(
        [sys.executable, "-m", "weaver.generate", "--prompt", "Repeat after me: the cat sat on the mat, the cat "
         "sat on the mat.", "--method", "prompt_lookup", "--budget", "8", "--max-new-tokens", "20", "--expected",
         "--json"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    record = json.loads(cli.stdout)
    eos = tokenizer.eos_token_id  # the CLI stops at EOS; generate() above was given no EOS
    assert record["output_ids"] == (reference[: reference.index(eos) + 1] if eos in reference else reference)
    assert record["stats"]["tau"] > 1.5 and record["text"]
    stats = record["stats"]  # greedy: each step's expected accept length is its realized one
    assert stats["expected_accept_lengths"] == [float(a) for a in stats["accept_lengths"]]
    assert stats["tau_expected"] == pytest.approx(stats["tau"])
