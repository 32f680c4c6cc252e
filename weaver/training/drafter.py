"""Drafter training: `python -m weaver.train drafter` (METHOD.md section 2, SpecForge / ModelOpt-style recipe).

Per training sequence (target features cached by features.py): sample random anchors a in the completion; each anchor
gives a block [x_a, MASK x (B-1)] at positions a..a+B-1 that sees the context features of positions < a. All blocks
of a sequence run in ONE drafter pass (a mask keeps them apart; test_drafter checks it equals separate passes). Block
depth d predicts x_{a+d}; the loss is KL to the target's (top-k) distribution at that position, or cross-entropy to
its argmax, weighted by exp(-(d - 1) / gamma). The target's embedding and lm_head are frozen.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from weaver.drafter import Drafter, DrafterConfig, build_target_layer_ids, save_drafter
from weaver.training.features import (
    FeatureSpec,
    FeatureStore,
    add_data_arguments,
    anchor_range,
    compute_features,
    training_sequences,
)
from weaver.training.losses import argmax_cross_entropy, position_decay, sparse_kl, weighted_mean
from weaver.training.resume import add_restart_argument, fingerprint, resumable, store_fingerprint

STATE_FILE = "train_state.pt"


@dataclass(frozen=True)
class DrafterTrainConfig:
    steps: int = 2000
    lr: float = 6e-4
    weight_decay: float = 0.0
    warmup_steps: int = 50
    seqs_per_step: int = 4
    anchors_per_seq: int = 16
    gamma: float = 7.0
    loss: str = "kl"
    grad_clip: float = 1.0
    save_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss not in ("kl", "ce"):
            raise ValueError(f"loss must be 'kl' or 'ce', got {self.loss!r}")


@dataclass(frozen=True)
class TrainStats:
    steps: int
    first_loss: float
    last_loss: float


def sample_anchors(prompt_len: int, seq_len: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """Up to n distinct sorted anchors a with 1 <= a, a + 1 >= prompt_len (first prediction in the completion) and
    a <= seq_len - 2 (at least one target token after the root). Empty when the sequence has none."""
    anchors = anchor_range(prompt_len, seq_len)
    if not anchors:
        return torch.zeros(0, dtype=torch.long)
    choice = torch.randperm(len(anchors), generator=generator)[:n]
    return (choice + anchors.start).sort().values


def pack_blocks(anchors: torch.Tensor, seq_len: int, cfg: DrafterConfig, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs of all anchor blocks of one sequence for one masked drafter pass.

    Returns block_ids [A*B], positions [A*B], mask [A*B, seq_len + A*B] (block j sees context < a_j and its own
    block), targets [A, B-1] (token index a + d, clamped) and valid [A, B-1] (a + d < seq_len).
    """
    bsz = cfg.block_size
    num = anchors.numel()
    depth = torch.arange(bsz)
    positions = (anchors[:, None] + depth).reshape(-1)
    block_ids = torch.full((num, bsz), cfg.mask_token_id, dtype=torch.long)
    block_ids[:, 0] = ids[anchors]
    block_of = torch.arange(num).repeat_interleave(bsz)
    ctx_visible = torch.arange(seq_len)[None, :] < anchors.repeat_interleave(bsz)[:, None]
    same_block = block_of[:, None] == block_of[None, :]
    targets = anchors[:, None] + depth[1:]
    return {
        "block_ids": block_ids.reshape(-1),
        "positions": positions,
        "mask": torch.cat([ctx_visible, same_block], dim=1),
        "targets": targets.clamp_max(seq_len - 1),
        "valid": targets < seq_len,
    }


def block_hidden(
    drafter: Drafter, embed_tokens: nn.Module, example: dict[str, Any], anchors: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Drafter hidden [A, B-1, d] of the anchor blocks of one cached example (one masked pass), and the packing."""
    cfg = drafter.cfg
    ids = example["ids"]
    seq_len = ids.numel()
    packed = pack_blocks(anchors, seq_len, cfg, ids)
    dtype = drafter.fc.weight.dtype
    feats = example["hidden"][None, :, : len(cfg.target_layer_ids)].to(dtype)
    context = drafter.context_kv(feats, torch.arange(seq_len)[None])
    with torch.no_grad():
        block_embeds = embed_tokens(packed["block_ids"])[None].to(dtype)
    hidden = drafter(block_embeds, packed["positions"][None], context, packed["mask"][None])
    return hidden[0].view(anchors.numel(), cfg.block_size, -1)[:, 1:], packed


def batch_loss(
    drafter: Drafter,
    embed_tokens: nn.Module,
    lm_head: nn.Module,
    batch: list[tuple[dict[str, Any], torch.Tensor]],
    train: DrafterTrainConfig,
) -> torch.Tensor:
    """Mean over the (cached example, anchors [A]) pairs of each one's position-decayed loss.

    The drafter runs once per example (its context differs); the frozen LM head and the loss run once over the rows
    of all examples: one [sum of rows, V] GEMM instead of one per example (the LM head is most of a step's time).
    """
    depth_weights = position_decay(drafter.cfg.block_size - 1, train.gamma)
    hidden_rows, top_ids, top_logprobs, weights = [], [], [], []
    for example, anchors in batch:
        hidden, packed = block_hidden(drafter, embed_tokens, example, anchors)
        valid = packed["valid"].reshape(-1)
        hidden_rows.append(hidden.reshape(-1, hidden.shape[-1])[valid])
        rows = packed["targets"].reshape(-1)[valid] - 1  # the target at position t - 1 predicts token t
        top_ids.append(example["top_ids"][rows].long())
        top_logprobs.append(example["top_logprobs"][rows])
        weights.append(depth_weights.expand(anchors.numel(), -1).reshape(-1)[valid])
    logits = lm_head(torch.cat(hidden_rows))
    if train.loss == "kl":
        per_row = sparse_kl(logits, torch.cat(top_ids), torch.cat(top_logprobs))
    else:
        per_row = argmax_cross_entropy(logits, torch.cat(top_ids))
    per_example = per_row.split([w.numel() for w in weights])
    return torch.stack([weighted_mean(v, w) for v, w in zip(per_example, weights, strict=True)]).mean()


def init_drafter(cfg: DrafterConfig, seed: int) -> Drafter:
    """A fresh drafter: linear weights ~ N(0, 0.02^2), norms at 1 (the HF Qwen3 initialisation)."""
    torch.manual_seed(seed)
    drafter = Drafter(cfg)
    for module in drafter.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
    return drafter


def lr_factor(step: int, train: DrafterTrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    progress = (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_drafter(
    drafter: Drafter,
    store: FeatureStore,
    embed_tokens: nn.Module,
    lm_head: nn.Module,
    train: DrafterTrainConfig,
    out_dir: str | Path,
    log=print,
    restart_if_changed: bool = False,
) -> TrainStats:
    """AdamW over the drafter only; saves `train_state.pt` every save_every steps and resumes from it.

    A resumed run restores weights, optimizer and step; its data order is reseeded by (seed, step). A state of another
    architecture or recipe is refused (weaver.training.resume), or moved aside with restart_if_changed.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, train))
    inputs = {
        "target_embed_head": fingerprint([*embed_tokens.state_dict().values(), *lm_head.state_dict().values()]),
        "features": store_fingerprint(store),
    }
    start = _resume(out_dir / STATE_FILE, drafter, opt, sched, train, inputs, restart_if_changed, log)
    rng = random.Random(train.seed * 1_000_003 + start)
    gen = torch.Generator().manual_seed(train.seed * 1_000_003 + start)
    examples = _forever(store, rng)
    first = last = float("nan")
    drafter.train()
    for step in range(start, train.steps):
        opt.zero_grad(set_to_none=True)
        batch = []
        while len(batch) < train.seqs_per_step:
            ex = next(examples)
            anchors = sample_anchors(ex["prompt_len"], ex["ids"].numel(), train.anchors_per_seq, gen)
            if anchors.numel():
                batch.append((ex, anchors))
        loss = batch_loss(drafter, embed_tokens, lm_head, batch, train)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
        opt.step()
        sched.step()
        last = loss.item()
        first = last if step == start else first
        if step % 10 == 0 or step + 1 == train.steps:
            log(f"drafter step {step + 1}/{train.steps} loss {last:.4f} lr {sched.get_last_lr()[0]:.2e}")
        if (step + 1) % train.save_every == 0 or step + 1 == train.steps:
            _save_state(out_dir / STATE_FILE, drafter, opt, sched, step + 1, train, inputs)
    drafter.eval()
    return TrainStats(steps=train.steps - start, first_loss=first, last_loss=last)


def _forever(store: FeatureStore, rng: random.Random):
    while True:
        yield from store.iterate(rng)


def _save_state(path: Path, drafter, opt, sched, step: int, train: DrafterTrainConfig, inputs: dict[str, str]) -> None:
    state = {
        "step": step,
        "model_config": asdict(drafter.cfg),
        "train_config": asdict(train),
        "inputs": inputs,
        "drafter": drafter.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _resume(
    path: Path, drafter, opt, sched, train: DrafterTrainConfig, inputs: dict[str, str], restart_if_changed: bool, log
) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    if not resumable(path, state, asdict(drafter.cfg), asdict(train), restart_if_changed, log, inputs):
        return 0
    drafter.load_state_dict(state["drafter"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    log(f"drafter: resumed from {path} at step {state['step']}")
    return state["step"]


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `python -m weaver.train drafter`."""
    parser.add_argument("--model", required=True, help="target: registry name (e.g. smollm2-135m) or a local folder")
    parser.add_argument("--out", required=True, help="output folder: DFlash-format checkpoint + train_state.pt")
    parser.add_argument("--features", default=None, help="feature cache folder (default: OUT/features)")
    add_data_arguments(parser)
    parser.add_argument("--block-size", type=int, default=16, help="block size B (B - 1 drafted positions)")
    parser.add_argument("--num-layers", type=int, default=2, help="draft layers (DFlash uses 1-5)")
    parser.add_argument(
        "--target-layer-ids", type=int, nargs="+", default=None, help="target taps (default: DFlash's even spacing)"
    )
    parser.add_argument("--mask-token-id", type=int, default=None, help="MASK token id (default: vocab_size - 1)")
    parser.add_argument("--intermediate-size", type=int, default=None, help="drafter MLP width (default: target's)")
    parser.add_argument("--steps", type=int, default=DrafterTrainConfig.steps, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=DrafterTrainConfig.lr, help="peak AdamW learning rate")
    parser.add_argument("--warmup-steps", type=int, default=DrafterTrainConfig.warmup_steps, help="linear warmup")
    parser.add_argument("--seqs-per-step", type=int, default=DrafterTrainConfig.seqs_per_step, help="sequences/step")
    parser.add_argument(
        "--anchors-per-seq", type=int, default=DrafterTrainConfig.anchors_per_seq, help="random anchor blocks/sequence"
    )
    parser.add_argument("--gamma", type=float, default=DrafterTrainConfig.gamma, help="position decay exp(-(d-1)/g)")
    parser.add_argument("--loss", choices=("kl", "ce"), default="kl", help="KL to target top-k, or CE to its argmax")
    parser.add_argument("--save-every", type=int, default=DrafterTrainConfig.save_every, help="checkpoint period")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation, anchors and data order")
    add_restart_argument(parser)


def drafter_config_for(model: Any, args: argparse.Namespace) -> DrafterConfig:
    """Drafter architecture matching the target's width, heads and RoPE (as DFlash drafters do).

    `model.config` is the target's weaver.models.ModelConfig.
    """
    tc = model.config
    layer_ids = tuple(args.target_layer_ids or build_target_layer_ids(tc.num_hidden_layers, args.num_layers))
    return DrafterConfig(
        block_size=args.block_size,
        target_layer_ids=layer_ids,
        mask_token_id=tc.vocab_size - 1 if args.mask_token_id is None else args.mask_token_id,
        num_target_layers=tc.num_hidden_layers,
        hidden_size=tc.hidden_size,
        num_layers=args.num_layers,
        num_heads=tc.num_attention_heads,
        num_kv_heads=tc.num_key_value_heads,
        head_dim=tc.head_dim,
        intermediate_size=args.intermediate_size or tc.intermediate_size,
        vocab_size=tc.vocab_size,
        rope_theta=tc.rope_theta,
        rms_norm_eps=tc.rms_norm_eps,
    )


def main(args: argparse.Namespace) -> None:
    from weaver.models import load_target

    torch.manual_seed(args.seed)
    model, tokenizer = load_target(args.model)
    model.eval().requires_grad_(False)
    cfg = drafter_config_for(model, args)
    spec = FeatureSpec(args.model, cfg.hidden_layers, top_k=args.top_k, shard_size=args.shard_size)
    features_dir = Path(args.features or Path(args.out) / "features")
    store = compute_features(model, training_sequences(args, model, tokenizer, features_dir), features_dir, spec)
    train = DrafterTrainConfig(
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        seqs_per_step=args.seqs_per_step,
        anchors_per_seq=args.anchors_per_seq,
        gamma=args.gamma,
        loss=args.loss,
        save_every=args.save_every,
        seed=args.seed,
    )
    drafter = init_drafter(cfg, args.seed)
    stats = train_drafter(
        drafter, store, model.embed_tokens, model.lm_head, train, args.out, restart_if_changed=args.restart_if_changed
    )
    save_drafter(drafter, args.out)
    print(f"drafter saved to {args.out}: loss {stats.first_loss:.4f} -> {stats.last_loss:.4f} over {stats.steps} steps")
