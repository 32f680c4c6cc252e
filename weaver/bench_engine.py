"""Engine benchmark: our autoregressive decoding against transformers' `generate`, side by side in one run.

Same target weights (both loaded from the same checkpoint), same prompts, greedy, fp32, EOS ignored so both produce
exactly `--max-new-tokens` tokens. Prints a table of tokens/s (wall time including prefill) and the ratio, and checks
that both produced the same tokens. The last rows are the machine's GEMV floor for this model, timed in the same
run: one matrix-vector product with every weight matrix a decode step reads, in the layout our engine reads them
(the fused q|k|v and gate|up, input-major, see Transformer.prepare_for_inference) and in transformers' (every
nn.Linear as stored, [out, in]). Weight streaming bounds every fp32 decoder, so floor / transformers approximates
the best ratio an engine in that layout can reach, and the two floors show how much of the ratio is the layout.
`--verify-nodes N ...` adds a table of one tree verify of N nodes (the step of every speculative method) with the
CPU weights pre-packed for oneDNN (the loaders' default) and without, timed side by side. On a machine whose speed
drifts (a shared host), `--rounds R` repeats the comparison R times: the ratio is the median of the rounds' ratios,
each of which is printed.

    python -m weaver.bench_engine --model smollm2-135m --prompts 4 --max-new-tokens 128 --verify-nodes 16 32 64
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from weaver.generate import generate

PROMPTS = (
    "Explain how a hash map works.",
    "Write a haiku about the sea.",
    "What are the three laws of thermodynamics?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Summarise the plot of Hamlet.",
    "List five prime numbers and explain why they are prime.",
    "How do I reverse a linked list in Python?",
)


def _hf_generate(hf_model, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], float]:
    ids = torch.tensor([prompt_ids])
    config = copy.deepcopy(hf_model.generation_config)
    # no EOS: both engines run exactly max_new_tokens greedy steps (min_new_tokens would mask EOS and change tokens)
    config.update(eos_token_id=None, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    start = time.perf_counter()
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt_ids) :].tolist(), time.perf_counter() - start


@dataclass(frozen=True)
class RoundResult:
    """One pass over the prompts, the two engines alternating per prompt: mean tokens/s of each, matching outputs."""

    ours_tps: float
    theirs_tps: float
    same_outputs: int

    @property
    def ratio(self) -> float:
        return self.ours_tps / self.theirs_tps


def compare_round(model, hf_model, prompts: Sequence[list[int]], max_new_tokens: int) -> RoundResult:
    """Greedy AR on every prompt with our engine, then transformers', alternating (slow drifts hit both alike)."""
    ours, theirs, same = [], [], 0
    for ids in prompts:
        res = generate(model, ids, max_new_tokens=max_new_tokens)
        ours.append(res.stats.tokens_per_s)
        hf_ids, hf_s = _hf_generate(hf_model, ids, max_new_tokens)
        theirs.append(len(hf_ids) / hf_s)
        same += hf_ids == res.output_ids
    return RoundResult(statistics.mean(ours), statistics.mean(theirs), same)


def _decode_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The distinct weight matrices a decode step multiplies, as it stores them: after prepare_for_inference the
    fused q|k|v and gate|up matrices in place of the nn.Linear weights that are row views of them."""
    fused = [getattr(m, name, None) for m in model.modules() for name in ("qkv_weight", "gate_up_weight")]
    fused = [w for w in fused if w is not None]
    fused_storage = {w.untyped_storage().data_ptr() for w in fused}
    linears = {
        id(m.weight): m.weight
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight.untyped_storage().data_ptr() not in fused_storage
    }
    return [*linears.values(), *fused]


def gemv_floor_s(model: torch.nn.Module, repeats: int = 20) -> float:
    """Seconds for one matrix-vector product with every weight matrix of a decode step (_decode_weights; a tied
    lm_head counts once), median of `repeats`.

    This is the weight-streaming cost of a batch-1 decode step with no attention, norms, sampling or Python overhead.
    """
    weights = _decode_weights(model)
    xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 2):
            start = time.perf_counter()
            for w in weights:
                torch.nn.functional.linear(xs[w.shape[1]], w)
            times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def verify_ms(model, prefix: list[int], n_nodes: int, repeats: int = 10) -> float:
    """Median milliseconds of one verify of an N-node tree (each node's parent (i - 1) // 2) after `prefix`."""
    from weaver.tree import Tree

    parents = [-1] + [(i - 1) // 2 for i in range(1, n_nodes)]
    tree = Tree.from_lists([(7 * i + 1) % model.config.vocab_size for i in range(n_nodes)], parents)
    cache = model.new_cache(max_seq_len=len(prefix) + n_nodes + 1, max_tree_nodes=n_nodes)
    times = []
    with torch.inference_mode():
        model(torch.tensor([prefix]), cache=cache)
        for _ in range(repeats + 2):
            start = time.perf_counter()
            model.verify(tree, cache)
            times.append(time.perf_counter() - start)
            cache.discard_pending()
    return 1e3 * statistics.median(times[2:])


def verify_table(model, prefix: list[int], sizes: Sequence[int]) -> list[str]:
    """Markdown rows: verify ms per tree size with unpacked and pre-packed weights, measured alternately."""
    rows = [
        "| tree nodes | verify ms, plain weights | verify ms, pre-packed (default) | speedup |",
        "|---|---|---|---|",
    ]
    for n in sizes:
        model.prepare_for_inference(pack=False)
        plain = verify_ms(model, prefix, n)
        model.prepare_for_inference(pack=True)
        packed = verify_ms(model, prefix, n)
        rows.append(f"| {n} | {plain:.1f} | {packed:.1f} | {plain / packed:.2f}x |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m weaver.bench_engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="registry name or local Hugging Face folder")
    p.add_argument("--prompts", type=int, default=4, help=f"number of prompts (at most {len(PROMPTS)})")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt by both engines")
    p.add_argument(
        "--rounds", type=int, default=1, help="passes over the prompts (report the median; the spread shows noise)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--verify-nodes", type=int, nargs="*", default=(), help="also time one tree verify of each of these sizes"
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    from weaver.models import load_hf_reference, load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.model)
    hf_model = load_hf_reference(args.model)
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for text in PROMPTS[: args.prompts]
    ]
    # warm-up: first calls pay for allocator growth and lazy initialisation in both engines
    generate(model, prompts[0], max_new_tokens=8)
    _hf_generate(hf_model, prompts[0], 8)

    rounds = [compare_round(model, hf_model, prompts, args.max_new_tokens) for _ in range(args.rounds)]
    ours_m = statistics.median(r.ours_tps for r in rounds)
    theirs_m = statistics.median(r.theirs_tps for r in rounds)
    ratios = sorted(r.ratio for r in rounds)  # each from one round's paired runs
    ratio = statistics.median(ratios)
    same = min(r.same_outputs for r in rounds)
    floor = 1.0 / gemv_floor_s(model)
    hf_floor = 1.0 / gemv_floor_s(hf_model)
    n_params = sum(w.numel() for w in _decode_weights(model))
    print(f"machine: {platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}")
    print(f"model {args.model}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy, fp32")
    print(f"{args.rounds} round(s); a round runs every prompt on both engines, alternating\n")
    print("| engine | tokens/s (mean over prompts; median over rounds) |")
    print("|---|---|")
    print(f"| weaver AR (`weaver.generate`) | {ours_m:.1f} |")
    print(f"| transformers `generate` | {theirs_m:.1f} |")
    print(f"| GEMV floor ({n_params / 1e6:.0f}M weights, one matrix-vector product each, our layout) | {floor:.1f} |")
    print(f"| GEMV floor, transformers' layout (every nn.Linear [out, in]) | {hf_floor:.1f} |")
    print(f"\nratio weaver / transformers: {ratio:.2f}x; identical outputs on {same}/{len(prompts)} prompts")
    if len(rounds) > 1:
        print(f"ratio per round (the headline is their median): {' '.join(f'{x:.2f}x' for x in ratios)}")
    print(f"upper bound of any fp32 engine over transformers on this machine: {floor / theirs_m:.2f}x (GEMV floor)")
    if args.verify_nodes:
        print(f"\none tree verify after the first prompt ({len(prompts[0])} tokens), median of 10:\n")
        print("\n".join(verify_table(model, prompts[0], args.verify_nodes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
