"""The speculative engine: prefill, then draft -> build tree -> verify -> accept -> commit (METHOD.md sections 1, 4-7).

`generate` is the whole story in one function; `python -m weaver.generate` is its command line.

Counting convention: the prefill produces the first new token and counts as one step, so plain autoregressive
decoding has tau = new_tokens / steps = 1 exactly, and a speculative step that accepts `a` drafts counts a + 1 tokens.
(SGLang's spec_verify_ct leaves the prefill out; our tau is lower by at most one token per request.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from weaver.sources import SOURCES, TreeSource, make_source
from weaver.tree import Tree
from weaver.verify import GREEDY, MODES, SAMPLING_MODES, SamplingParams, accept, expected_accepted, target_probs


@dataclass(frozen=True)
class GenerationStats:
    """Per-request statistics. Lists have one entry per decode step after the prefill."""

    prompt_tokens: int
    new_tokens: int
    steps: int  # prefill + speculative (or AR) steps
    accept_lengths: list[int]  # per step: accepted drafts + 1 bonus (before EOS / max_new_tokens truncation)
    tree_sizes: list[int]  # per step: drafted nodes (budget used)
    draft_s: list[float]
    tree_s: list[float]
    verify_s: list[float]  # target forward + accept + commit
    ttft_s: float
    wall_s: float  # including prefill
    hit_eos: bool = False
    # with generate(expected=True), per step: the expected accept length given that step's tree and context, 1 + the
    # sum of the target's path probabilities over the drafted nodes (exact, from the verify logits; AR steps 1; not
    # cut at EOS or max_new_tokens, like accept_lengths)
    expected_accept_lengths: list[float] | None = None

    @property
    def tau(self) -> float:
        """Mean tokens per target forward (acceptance length, bonus included)."""
        return self.new_tokens / max(self.steps, 1)

    @property
    def tau_expected(self) -> float | None:
        """tau with each step's accept length replaced by its expectation, but the last step's (None without
        expected_accept_lengths).

        A step's accept length minus its expectation has mean zero given the steps before it, so this estimates
        what tau does without most of the verifier's sampling noise: at temperature > 0 it compares two methods
        on a few prompts more precisely than tau. The last step keeps its realized tokens, as EOS or max_new_tokens
        may have cut them (its expectation counts tokens past the cut). Equal to tau at temperature 0.
        """
        if self.expected_accept_lengths is None:
            return None
        noise = sum(self.accept_lengths[:-1]) - sum(self.expected_accept_lengths[:-1])
        return (self.new_tokens - noise) / max(self.steps, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tau": self.tau, "tau_expected": self.tau_expected, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class GenerationResult:
    output_ids: list[int]
    stats: GenerationStats = field(repr=False)


def _clock(device: torch.device) -> float:
    """perf_counter once the device's queued work is done: CUDA runs asynchronously, and a stage's time (draft, tree,
    verify) must hold its own kernels, not the next stage's first synchronisation."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from [V] logits: argmax at temperature 0, else a draw from the filtered target distribution."""
    if params.temperature == 0:
        return int(logits.argmax())
    probs = target_probs(logits[None].double(), params)[0]
    return int(torch.multinomial(probs, 1, generator=generator))


def _check_inputs(model: Any, prompt_ids: Sequence[int], budget: int, max_new_tokens: int, mode: str) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token or a chat template)")
    if budget < 0:
        raise ValueError(f"budget must be >= 0 (drafted nodes per step), got {budget}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if mode not in MODES:
        raise ValueError(f"verify mode must be one of {MODES}, got {mode!r}")
    context = model.config.max_position_embeddings
    if len(prompt_ids) + max_new_tokens - 1 > context:  # the last new token is never fed back: it needs no position
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) - 1 exceeds the model's context "
            f"of {context} tokens: shorten the prompt or lower max_new_tokens"
        )
    vocab = model.config.vocab_size
    if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab}) (the target's vocabulary)")


@torch.inference_mode()
def generate(
    model: Any,
    prompt_ids: Sequence[int],
    *,
    source: TreeSource | None = None,
    budget: int = 0,
    max_new_tokens: int = 256,
    params: SamplingParams = GREEDY,
    mode: str = "target_only",
    eos_ids: Iterable[int] = (),
    seed: int = 0,
    expected: bool = False,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids`, autoregressively (source None) or speculatively.

    Lossless: at temperature 0 the output equals plain greedy decoding token for token; at temperature > 0 it is
    distributed exactly as the target's samples (mode "target_only" or "traversal"; "greedy" is forced at T = 0).
    With `expected`, stats also carry each step's expected accept length (benchmarks log it): computed from the
    verify logits after the step's clock stops (a few ms per step on the host), and left out of wall_s.
    """
    _check_inputs(model, prompt_ids, budget, max_new_tokens, mode)
    mode = "greedy" if params.temperature == 0 else mode
    eos = set(eos_ids)
    generator = torch.Generator().manual_seed(seed)
    layers = source.hidden_layers if source is not None else ()
    cache = model.new_cache(max_seq_len=len(prompt_ids) + max_new_tokens + budget + 1, max_tree_nodes=budget + 1)
    draft_s: list[float] = []
    tree_s: list[float] = []
    verify_s: list[float] = []
    accept_lengths: list[int] = []
    expected_accept_lengths: list[float] = []
    untimed = 0.0  # seconds spent on expected_accept_lengths, left out of wall_s
    tree_sizes: list[int] = []

    # models run on their own device; trees, verification and sampling (a CPU generator) stay on the host
    device = model.embed_tokens.weight.device
    start = _clock(device)
    prompt = torch.tensor(prompt_ids, dtype=torch.long, device=device)
    out = model(prompt[None], cache=cache, hidden_layers=layers, last_logits_only=True)
    tokens = [_sample(out.logits[0, -1].cpu(), params, generator)]
    ttft = _clock(device) - start
    if source is not None:
        source.begin(prompt, out.hidden[0] if layers else None)

    while len(tokens) < max_new_tokens and tokens[-1] not in eos:
        root = tokens[-1]
        t0 = _clock(device)
        if source is None:  # plain autoregressive step: the root goes straight into the cache
            logits = model(torch.tensor([[root]], device=device), cache=cache).logits[0, -1]
            new = [_sample(logits.cpu(), params, generator)]
            t1 = t2 = t0
            verified = None
        else:
            draft = source.draft(root, generator)
            t1 = _clock(device)
            tree = source.build(draft, root, budget, generator) if budget > 0 else Tree.root_only(root)
            room = model.config.max_position_embeddings - 1 - cache.seq_len  # deepest node position that fits
            if room < tree.budget:  # near the end of the context: a node at depth d sits at position seq_len + d
                tree = tree.truncate(room)
            t2 = _clock(device)
            out = model.verify(tree, cache, hidden_layers=layers)
            logits = out.logits[0].cpu()
            verdict = accept(tree, logits, params, mode=mode, generator=generator)
            verified = (tree, logits)
            model.commit(cache, verdict.path)
            path = torch.tensor(verdict.path, dtype=torch.long)
            source.observe(tree.tokens[path].to(device), out.hidden[0, path.to(device)] if layers else None)
            new = tree.tokens[path[1:]].tolist() + [verdict.bonus]
            tree_sizes.append(tree.budget)
        t3 = _clock(device)
        if expected:
            expected_accept_lengths.append(1.0 + (expected_accepted(*verified, params) if verified else 0.0))
            untimed += time.perf_counter() - t3
        draft_s.append(t1 - t0)
        tree_s.append(t2 - t1)
        verify_s.append(t3 - t2)
        accept_lengths.append(len(new))
        for tok in new:  # EOS inside an accepted path ends generation there
            if len(tokens) >= max_new_tokens or tokens[-1] in eos:
                break
            tokens.append(tok)

    stats = GenerationStats(
        prompt_tokens=len(prompt_ids),
        new_tokens=len(tokens),
        steps=1 + len(accept_lengths),
        accept_lengths=accept_lengths,
        tree_sizes=tree_sizes,
        draft_s=draft_s,
        tree_s=tree_s,
        verify_s=verify_s,
        ttft_s=ttft,
        wall_s=_clock(device) - start - untimed,
        hit_eos=tokens[-1] in eos,
        expected_accept_lengths=expected_accept_lengths if expected else None,
    )
    return GenerationResult(output_ids=tokens, stats=stats)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m weaver.generate", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="target: a registry name or a local Hugging Face folder")
    p.add_argument("--prompt", required=True, help="user message; formatted with the target's chat template")
    p.add_argument("--raw", action="store_true", help="feed --prompt as plain text, without the chat template")
    p.add_argument("--method", default="ar", help=f"ar or a tree source: {', '.join(sorted(SOURCES))}")
    p.add_argument("--budget", type=int, default=16, help="drafted tree nodes per step (verify width = budget + 1)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="upper bound on generated tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus filtering mass (1 = off)")
    p.add_argument("--mode", default="target_only", choices=SAMPLING_MODES, help="sampling verifier for T > 0")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--drafter", default=None, help="drafter checkpoint folder (drafter-based methods)")
    p.add_argument("--adapter", default=None, help="Weaver adapter checkpoint file (weaver methods)")
    p.add_argument("--children", type=int, default=8, help="weaver builder fan-out per expanded node (paper: 8)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--device", default="cpu", help="where the target, drafter and adapter run: cpu, cuda or cuda:N (default cpu)"
    )
    p.add_argument(
        "--expected",
        action="store_true",
        help="also log each step's expected accept length and tau_expected (tau without the verifier's sampling "
        "noise; computed from the verify logits, untimed)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with output_ids, text and stats")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    from weaver.backends.engine import check_device, place  # deferred: keeps `--help` instant
    from weaver.models import load_target

    check_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.model)
    model = place(model, args.device)  # the source moves the drafter and adapter it loads to the target's device
    if args.raw:
        prompt_ids = tokenizer.encode(args.prompt)
    else:
        prompt_ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    options: dict[str, Any] = {}
    if args.drafter:
        options["drafter"] = args.drafter
    if args.adapter:
        options["adapter"] = args.adapter
        options["children"] = args.children
    source = make_source(args.method, model, **options)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    result = generate(
        model,
        list(prompt_ids),
        source=source,
        budget=args.budget if source is not None else 0,
        max_new_tokens=args.max_new_tokens,
        params=params,
        mode=args.mode,
        eos_ids=[tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [],
        seed=args.seed,
        expected=args.expected,
    )
    text = tokenizer.decode(result.output_ids, skip_special_tokens=True)
    stats = result.stats.to_dict()
    if args.json:
        print(json.dumps({"output_ids": result.output_ids, "text": text, "stats": stats}))
    else:
        print(text)
        print(
            f"\n[{args.method}] {stats['new_tokens']} tokens in {stats['steps']} steps: tau {stats['tau']:.2f}, "
            f"{stats['tokens_per_s']:.1f} tok/s, TTFT {stats['ttft_s'] * 1e3:.0f} ms",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
