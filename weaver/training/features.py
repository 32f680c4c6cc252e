"""Target features for drafter and adapter training, computed once and cached to disk (METHOD.md section 2).

`python -m weaver.train features` caches them for a trained drafter's taps without training anything (the Weaver
adapter can train on more sequences than its drafter saw); `python -m weaver.train drafter` caches them on its way.

For each training sequence the target runs once (cache=None, full causal pass) and we keep what drafter training
needs: the hidden states of the drafter's tap layers and the target's top-k next-token log-probs at every position
(the loss's sparse target distribution; top-k ids are sorted, so ids[:, 0] is the argmax).

Layout of a feature folder::

    meta.json          FeatureSpec + data fingerprint + counts (written first; a mismatch on resume is an error)
    shard_00000.pt     list of examples: {"ids" [T] int64, "hidden" [T, L, d], "top_ids" [T, k] int32,
    shard_00001.pt      "top_logprobs" [T, k] float32, "prompt_len" int}
    ...

Shards land atomically (temp file + rename), so an interrupted run resumes at the first missing shard, and several
processes can share one folder (`--workers N --worker K`: worker K writes shards K, K + N, ...).
`weaver.train features` writes summary.json last: it marks a finished folder (the workflow's output).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from weaver.training.resume import changed_fields

SUMMARY = "summary.json"  # written last by `weaver.train features`
COMPLETIONS_SETTINGS = "completions.settings.json"  # the regeneration settings of completions.jsonl
REGEN_FIELDS = ("num_sequences", "regen_tokens", "regen_temperatures", "regen_batch", "max_prompt_len", "seed")


@dataclass(frozen=True)
class TrainingSequence:
    """Token ids of one training text; anchors only predict tokens at index >= prompt_len (the completion)."""

    ids: tuple[int, ...]
    prompt_len: int = 0


@dataclass(frozen=True)
class FeatureSpec:
    """What a feature folder holds; any change needs a fresh folder."""

    model: str
    hidden_layers: tuple[int, ...]
    top_k: int = 32
    dtype: str = "float16"
    shard_size: int = 64


def anchor_range(prompt_len: int, length: int) -> range:
    """Anchors L of a sequence of `length` tokens whose prompt has `prompt_len`: the root x_L has a context (L >= 1),
    the first draft x_{L+1} lies in the completion (L >= prompt_len - 1) and has a target token (L <= length - 2).
    Drafter and adapter training and the teacher-forced evaluation sample their anchors from it."""
    return range(max(1, prompt_len - 1), length - 1)


def read_token_jsonl(path: str | Path) -> list[TrainingSequence]:
    """Sequences from a JSONL file: one `{"ids": [...], "prompt_len": k}` object (or a plain id list) per line."""
    sequences = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        ids, prompt_len = (row, 0) if isinstance(row, list) else (row.get("ids"), row.get("prompt_len", 0))
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError(f"{path}:{n}: expected a list of token ids or an object with 'ids'; got {line[:80]!r}")
        sequences.append(TrainingSequence(tuple(ids), int(prompt_len)))
    if not sequences:
        raise ValueError(f"{path} holds no sequences")
    return sequences


def tokenize_conversations(tokenizer: Any, conversations: Sequence, max_len: int) -> list[TrainingSequence]:
    """First exchange of each chat: prompt = chat template up to the first user turn, completion = the reply + EOS."""
    from weaver.data import Prompt, format_prompt

    sequences = []
    for messages in conversations:
        reply = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
        if reply is None or not messages[reply]["content"].strip():
            continue
        prompt = format_prompt(tokenizer, Prompt("train", "train", tuple(messages[:reply])))
        completion = tokenizer.encode(messages[reply]["content"], add_special_tokens=False)
        ids = (prompt + completion + [tokenizer.eos_token_id])[:max_len]
        if len(ids) > len(prompt) + 1:
            sequences.append(TrainingSequence(tuple(ids), len(prompt)))
    return sequences


def fingerprint(sequences: Sequence[TrainingSequence]) -> str:
    digest = hashlib.sha256()
    for seq in sequences:
        digest.update(json.dumps([seq.prompt_len, *seq.ids]).encode())
    return digest.hexdigest()[:16]


@torch.no_grad()
def target_features(model: Any, seq: TrainingSequence, spec: FeatureSpec) -> dict[str, Any]:
    """One example: the target's tap hidden states [T, L, d] and top-k log-probs [T, k] of sequence `seq`."""
    ids = torch.tensor(seq.ids, dtype=torch.long)
    out = model(ids[None], cache=None, hidden_layers=spec.hidden_layers)
    logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)
    top_logprobs, top_ids = logprobs.topk(spec.top_k, dim=-1)
    return {
        "ids": ids,
        "hidden": out.hidden[0].to(getattr(torch, spec.dtype)),
        "top_ids": top_ids.to(torch.int32),
        "top_logprobs": top_logprobs,
        "prompt_len": seq.prompt_len,
    }


def compute_features(
    model: Any,
    sequences: Sequence[TrainingSequence],
    out_dir: str | Path,
    spec: FeatureSpec,
    log=print,
    worker: int = 0,
    workers: int = 1,
) -> FeatureStore | None:
    """Write (or resume writing) the feature folder for `sequences`; returns the store once it is complete.

    With workers > 1 this process writes only shards worker, worker + workers, ... (the other workers share out_dir
    and write the rest); it returns None while shards of other workers are still missing.
    """
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}: pass 0 <= --worker < --workers")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_shards = -(-len(sequences) // spec.shard_size)
    meta = {
        "spec": asdict(spec),
        "fingerprint": fingerprint(sequences),
        "sequences": len(sequences),
        "shards": n_shards,
    }
    meta["spec"]["hidden_layers"] = list(spec.hidden_layers)
    meta_path = out_dir / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        raise ValueError(
            f"{out_dir} holds features of another target, layer set or data ({meta_path}); "
            "delete the folder or pass a different features directory"
        )
    _atomic(meta_path, lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=2)))
    for shard in range(worker, n_shards, workers):
        path = out_dir / f"shard_{shard:05d}.pt"
        if path.exists():
            continue
        chunk = sequences[shard * spec.shard_size : (shard + 1) * spec.shard_size]
        examples = [target_features(model, seq, spec) for seq in chunk]
        _atomic(path, lambda tmp, examples=examples: torch.save(examples, tmp))
        log(f"features: shard {shard + 1}/{n_shards} written ({len(chunk)} sequences)")
    missing = [i for i in range(n_shards) if not (out_dir / f"shard_{i:05d}.pt").exists()]
    if missing and workers > 1:
        log(f"features: worker {worker}/{workers} done; {len(missing)} shards of other workers still missing")
        return None
    return FeatureStore(out_dir)


class FeatureStore:
    """A finished feature folder; iterates examples shard by shard so only one shard is in memory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{self.path} is not a feature folder (no meta.json): run feature caching first")
        self.meta = json.loads(meta_path.read_text())
        self.shards = [self.path / f"shard_{i:05d}.pt" for i in range(self.meta["shards"])]
        missing = [p.name for p in self.shards if not p.exists()]
        if missing:
            raise FileNotFoundError(f"{self.path} is incomplete (missing {missing[:3]}...): resume feature caching")

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return tuple(self.meta["spec"]["hidden_layers"])

    def __len__(self) -> int:
        return self.meta["sequences"]

    def iterate(self, rng: random.Random | None = None) -> Iterator[dict[str, Any]]:
        """Examples in file order, or shuffled (shard order and order within each shard) with `rng`."""
        order = list(range(len(self.shards)))
        if rng is not None:
            rng.shuffle(order)
        for shard in order:
            examples = torch.load(self.shards[shard], weights_only=True)
            if rng is not None:
                rng.shuffle(examples)
            yield from examples


def _atomic(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@torch.no_grad()
def regenerate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperatures: Sequence[float],
    eos_id: int | None,
    batch_size: int = 16,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[TrainingSequence]:
    """The target's own completions of `prompts` (the DFlash recipe trains on target-regenerated text, METHOD.md 2).

    Prompts of equal length decode together (the cache holds equal-length sequences, so no padding is needed);
    batch i uses temperatures[i % len] (0 = greedy). A completion ends after its first EOS or max_new_tokens.
    `log`, when given, gets a progress line about every tenth of the batches.
    """
    buckets: dict[int, list[Sequence[int]]] = {}
    for ids in prompts:
        buckets.setdefault(len(ids), []).append(ids)
    batches = [group[i : i + batch_size] for group in buckets.values() for i in range(0, len(group), batch_size)]
    gen = torch.Generator().manual_seed(seed)
    sequences = []
    for n, batch in enumerate(batches):
        new = _decode_batch(model, torch.tensor(batch), max_new_tokens, temperatures[n % len(temperatures)], gen)
        for ids, completion in zip(batch, new.tolist(), strict=True):
            if eos_id is not None and eos_id in completion:
                completion = completion[: completion.index(eos_id) + 1]
            sequences.append(TrainingSequence(tuple(ids) + tuple(completion), len(ids)))
        if log is not None and ((n + 1) % max(1, len(batches) // 10) == 0 or n + 1 == len(batches)):
            log(f"regenerate: batch {n + 1}/{len(batches)} ({len(sequences)} completions)")
    return sequences


def _decode_batch(
    model: Any, ids: torch.Tensor, max_new_tokens: int, temperature: float, gen: torch.Generator
) -> torch.Tensor:
    """Completion tokens [B, max_new_tokens] of prompts ids [B, T] (greedy at temperature 0, else sampled)."""
    cache = model.new_cache(max_seq_len=ids.shape[1] + max_new_tokens, batch_size=ids.shape[0])
    logits = model(ids, cache=cache, last_logits_only=True).logits[:, -1]
    out = []
    for _ in range(max_new_tokens):
        if temperature == 0:
            token = logits.argmax(-1)
        else:
            token = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=gen)[:, 0]
        out.append(token)
        logits = model(token[:, None], cache=cache).logits[:, -1]
    return torch.stack(out, dim=1)


def write_token_jsonl(path: str | Path, sequences: Sequence[TrainingSequence]) -> None:
    """The inverse of read_token_jsonl (one `{"ids", "prompt_len"}` object per line), written atomically."""
    lines = "".join(json.dumps({"ids": list(s.ids), "prompt_len": s.prompt_len}) + "\n" for s in sequences)
    _atomic(Path(path), lambda tmp: Path(tmp).write_text(lines))


# ---------------------------------------------------------------- training data


def training_sequences(
    args: argparse.Namespace, model: Any, tokenizer: Any, features_dir: Path
) -> list[TrainingSequence]:
    """Token sequences to featurise: ShareGPT replies, the target's own completions, or a JSONL of token ids."""
    from weaver.data import training_conversations

    if args.data == "target":
        cached = features_dir / "completions.jsonl"
        settings_path = features_dir / COMPLETIONS_SETTINGS
        settings = regen_settings(args)
        if not cached.exists():
            features_dir.mkdir(parents=True, exist_ok=True)
            write_token_jsonl(cached, target_completions(args, model, tokenizer))
            _atomic(settings_path, lambda tmp: Path(tmp).write_text(json.dumps(settings, indent=2)))
        elif settings_path.exists():  # (folders of 2026-12-05 and before have none: the count check below remains)
            diffs = changed_fields(json.loads(settings_path.read_text()), settings)
            if diffs:
                raise ValueError(
                    f"{cached} was regenerated with other settings ({'; '.join(diffs)}): delete {features_dir} "
                    "to regenerate, or pass another folder"
                )
        sequences = read_token_jsonl(cached)
        if len(sequences) < args.num_sequences:
            raise ValueError(
                f"{cached} holds {len(sequences)} completions, fewer than --num-sequences {args.num_sequences} "
                "(it was written for a smaller --num-sequences, whose prompts differ): delete it to regenerate"
            )
        return sequences[: args.num_sequences]
    if args.data != "sharegpt":
        return read_token_jsonl(args.data)[: args.num_sequences]
    return tokenize_conversations(tokenizer, training_conversations("train", limit=args.num_sequences), args.max_len)


def regen_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What decides a --data target regeneration (saved beside completions.jsonl; a cache of others is refused)."""
    return {"model": args.model, **{name: getattr(args, name) for name in REGEN_FIELDS}}


def interleave_full_batches(by_len: dict[int, list[list[int]]], batch: int) -> list[list[int]]:
    """Prompts in rounds: round r takes the r-th full batch of every length that has one, shortest length first;
    the partial remainders come last."""
    groups = [by_len[n] for n in sorted(by_len)]
    rounds = max((len(g) // batch for g in groups), default=0)
    full = [ids for r in range(rounds) for g in groups if r < len(g) // batch for ids in g[r * batch : (r + 1) * batch]]
    rest = [ids for g in groups for ids in g[len(g) // batch * batch :]]
    return full + rest


def target_completions(args: argparse.Namespace, model: Any, tokenizer: Any) -> list[TrainingSequence]:
    """args.num_sequences target completions of ShareGPT first turns of at most --max-prompt-len tokens.

    Prompts of equal length decode together (see regenerate), so they are taken in full batches of one length,
    lengths interleaved (a round over all lengths, then the next batch of each), which keeps prompt lengths diverse.
    """
    from weaver.data import Prompt, format_prompt, training_conversations

    by_len: dict[int, list[list[int]]] = {}
    for messages in training_conversations("train", limit=args.num_sequences * 20):
        user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if user is not None and messages[user]["content"].strip():
            ids = format_prompt(tokenizer, Prompt("train", "train", (messages[user],)))
            if len(ids) <= args.max_prompt_len:
                by_len.setdefault(len(ids), []).append(ids)
    prompts = interleave_full_batches(by_len, args.regen_batch)[: args.num_sequences]
    if len(prompts) < args.num_sequences:
        raise ValueError(
            f"only {len(prompts)} ShareGPT first turns fit --max-prompt-len {args.max_prompt_len}, fewer than "
            f"--num-sequences {args.num_sequences}: raise --max-prompt-len or lower --num-sequences"
        )
    temps = args.regen_temperatures
    print(f"regenerating {len(prompts)} completions of {args.regen_tokens} tokens at temperatures {temps}")
    eos = tokenizer.eos_token_id
    return regenerate(model, prompts, args.regen_tokens, temps, eos, args.regen_batch, args.seed, log=print)


# ---------------------------------------------------------------- command line


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Which sequences to featurise and how; shared by `weaver.train drafter` and `weaver.train features`."""
    parser.add_argument(
        "--data",
        default="sharegpt",
        help="'sharegpt' (weaver.data training split, first exchange of each chat), 'target' (first user turns of "
        "that split answered by the target itself, the DFlash recipe; cached as completions.jsonl in the feature "
        'folder) or a JSONL of token ids (one {"ids": [...], "prompt_len": k} or plain list per line)',
    )
    parser.add_argument("--regen-tokens", type=int, default=128, help="--data target: new tokens per completion")
    parser.add_argument(
        "--regen-temperatures",
        type=float,
        nargs="+",
        default=[0.0, 1.0],
        help="--data target: sampling temperatures cycled over batches (0 = greedy)",
    )
    parser.add_argument("--regen-batch", type=int, default=16, help="--data target: prompts decoded together")
    parser.add_argument("--max-prompt-len", type=int, default=96, help="--data target: longest prompt kept (tokens)")
    parser.add_argument("--num-sequences", type=int, default=512, help="training sequences to featurise")
    parser.add_argument("--max-len", type=int, default=384, help="--data sharegpt: cut sequences to this many tokens")
    parser.add_argument("--top-k", type=int, default=32, help="target log-probs kept per position for the KL loss")
    parser.add_argument("--shard-size", type=int, default=64, help="sequences per feature shard")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `python -m weaver.train features`."""
    parser.add_argument("--model", required=True, help="target: registry name (e.g. smollm2-135m) or a local folder")
    parser.add_argument(
        "--drafter", required=True, help="trained drafter folder: the features hold its target taps (target_layer_ids)"
    )
    parser.add_argument(
        "--out",
        required=True,
        help="feature folder to write, or to resume at its first missing shard (meta.json, shard_*.pt and, with "
        "--data target, completions.jsonl); a folder of another target, tap set or data is refused",
    )
    add_data_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the target's sampled completions (--data target)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes sharing --out (same flags, one --worker each); the one that finds every shard written "
        "writes summary.json",
    )
    parser.add_argument(
        "--worker",
        type=int,
        default=0,
        help="this process's index in [0, --workers): it writes shards worker, worker + workers, ...; with --data "
        "target worker 0 regenerates completions.jsonl, and the others start once that file exists",
    )


def main(args: argparse.Namespace) -> None:
    from weaver.drafter import load_drafter
    from weaver.models import load_target

    if not 0 <= args.worker < args.workers:
        raise ValueError(f"--worker {args.worker} --workers {args.workers}: pass 0 <= --worker < --workers")
    torch.manual_seed(args.seed)
    model, tokenizer = load_target(args.model)
    model.eval().requires_grad_(False)
    layers = tuple(load_drafter(args.drafter).hidden_layers)
    spec = FeatureSpec(args.model, layers, top_k=args.top_k, shard_size=args.shard_size)
    out = Path(args.out)
    if args.data == "target" and args.worker > 0 and not (out / "completions.jsonl").exists():
        raise ValueError(
            f"worker {args.worker}: {out / 'completions.jsonl'} does not exist yet; worker 0 regenerates it (with "
            "the same flags), start the other workers once it is written"
        )
    sequences = training_sequences(args, model, tokenizer, out)
    store = compute_features(model, sequences, out, spec, worker=args.worker, workers=args.workers)
    if store is None:
        return
    summary = {**store.meta, "tokens": sum(len(seq.ids) for seq in sequences)}
    _atomic(out / SUMMARY, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2)))
    print(f"features of {len(store)} sequences (target layers {list(layers)}, top {spec.top_k}) in {out}")
