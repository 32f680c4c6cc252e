"""Weaver adapter training (METHOD.md section 3): `python -m weaver.train adapter`.

A frozen drafter drafts at sampled anchors of target-generated sequences (cached target features, see features.py);
Weaver is teacher-forced along the ground-truth chain x_L (root), x_{L+1}, ..., x_{L+D-1}: the node at depth d scores
the pool of depth d + 1 against the target's conditional p(. | x_<=L+d) at position L + d.

Loss ("LK-style", arXiv 2602.23881): a mix of KL and total variation between Weaver's pool softmax q and the target's
conditional p restricted to the pool (not renormalised):
    TV term   1 - sum_{c in pool} min(p(c), q(c))   = 1 - acceptance of a one-token draft from q
    KL term   sum_{c in pool} p(c) (log p~(c) - log q(c)),  p~ = p / p(pool)
Tokens outside the pool are handled explicitly: q puts no mass there, so the target mass outside the pool (and beyond
the target's cached top-k) counts as unrecoverable rejection in the TV term and carries no KL gradient. The mixing
weight is constant (--kl-weight); the paper's exact schedule is unknown.
Optimiser: AdamW, or the paper's Muon (matrices) + AdamW (the rest) with --optimizer muon; warmup-stable-decay schedule;
checkpoints in the authors' format plus a resumable training state.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from weaver.adapter import CandidatePools, Weaver, WeaverConfig, candidate_pools
from weaver.training.features import anchor_range
from weaver.training.muon import Muon
from weaver.training.resume import add_restart_argument, fingerprint, resumable, store_fingerprint


@dataclass(frozen=True)
class AdapterBatch:
    """Teacher-forced chains at R anchors, D depths, pools of K, target top-k of k.

    target_hidden: [R, d_model]; proposal_hidden: [R, D, d_model] (drafter, frozen); pool_ids / pool_scores: [R, D, K];
    chain: [R, D] tokens at depths 0..D-1 (the root then the ground truth); target_ids / target_logprobs: [R, D, k]
    the target's conditional at each node; valid: [R, D] bool (the sequence extends that far).
    """

    target_hidden: torch.Tensor
    proposal_hidden: torch.Tensor
    pool_ids: torch.Tensor
    pool_scores: torch.Tensor
    chain: torch.Tensor
    target_ids: torch.Tensor
    target_logprobs: torch.Tensor
    valid: torch.Tensor


@dataclass(frozen=True)
class LossStats:
    """Means over valid rows: loss, its KL and TV terms, acceptance sum min(p, q), target mass inside the pool."""

    loss: float
    kl: float
    tv: float
    acceptance: float
    pool_mass: float


def target_pool_probs(pool_ids: torch.Tensor, target_ids: torch.Tensor, target_logprobs: torch.Tensor) -> torch.Tensor:
    """p(c) [N, K] for each pool token c from the target's sparse top-k [N, k]; 0 for tokens outside that top-k."""
    match = pool_ids[:, :, None] == target_ids[:, None, :].long()  # [N, K, k]
    return (match * target_logprobs.float().exp()[:, None, :]).sum(-1)


def lk_loss(
    logits: torch.Tensor,
    pool_ids: torch.Tensor,
    target_ids: torch.Tensor,
    target_logprobs: torch.Tensor,
    kl_weight: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-row LK loss [N] of pool logits [N, K] (-inf at padding) against the target's top-k [N, k]."""
    p = target_pool_probs(pool_ids, target_ids, target_logprobs)
    log_q = torch.log_softmax(logits.float(), dim=-1)
    q = log_q.exp()
    acceptance = torch.minimum(p, q).sum(-1)
    mass = p.sum(-1)
    log_p_tilde = torch.log(p.clamp_min(1e-30)) - torch.log(mass.clamp_min(1e-30))[:, None]
    kl = torch.where(p > 0, p * (log_p_tilde - log_q.clamp_min(-1e4)), torch.zeros_like(p)).sum(-1)
    tv = 1.0 - acceptance
    loss = kl_weight * kl + (1.0 - kl_weight) * tv
    return loss, {"kl": kl, "tv": tv, "acceptance": acceptance, "pool_mass": mass}


def teacher_forced_logits(
    weaver: Weaver,
    target_hidden: torch.Tensor,
    proposal_hidden: torch.Tensor,
    chain: torch.Tensor,
    pools: CandidatePools,
    embed_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
) -> torch.Tensor:
    """Pool logits [R, D, K] of Weaver walking the chains [R, D] (node at depth d scores the pool of depth d + 1).

    target_hidden [R, d_model], proposal_hidden [R, D, d_model]; pools hold ids / scores [R, D, K].
    """
    context = weaver.encode_context(target_hidden, proposal_hidden)
    rows, depth = chain.shape
    x = weaver.token_in(weaver.embed_norm(embed_weight[chain]))
    positions = torch.arange(1, depth + 1).expand(rows, depth)  # node at depth d sits at RoPE position d + 1
    h, _, _ = weaver.forward_tokens(x, positions, context)
    return weaver.pool_logits(h, pools, lm_head_weight)


def adapter_loss(
    weaver: Weaver, batch: AdapterBatch, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, kl_weight: float
) -> tuple[torch.Tensor, LossStats]:
    """Teacher-forced forward of the chains (module path, with gradients) and the mean LK loss over valid nodes."""
    pools = CandidatePools(batch.pool_ids, batch.pool_scores)
    logits = teacher_forced_logits(
        weaver, batch.target_hidden, batch.proposal_hidden, batch.chain, pools, embed_weight, lm_head_weight
    )
    valid = batch.valid.flatten()
    k = batch.pool_ids.shape[-1]
    per_row, parts = lk_loss(
        logits.reshape(-1, k)[valid],
        batch.pool_ids.reshape(-1, k)[valid],
        batch.target_ids.flatten(0, 1)[valid],
        batch.target_logprobs.flatten(0, 1)[valid],
        kl_weight,
    )
    loss = per_row.mean()
    stats = LossStats(
        float(loss.detach()), *(float(parts[n].detach().mean()) for n in ("kl", "tv", "acceptance", "pool_mass"))
    )
    return loss, stats


def sample_anchors(length: int, prompt_len: int, count: int, rng: random.Random) -> list[int]:
    """Anchors L (root = x_L) with a context (L >= 1) whose drafts x_{L+1}, ... lie in the completion."""
    anchors = anchor_range(prompt_len, length)
    return sorted(rng.sample(anchors, min(count, len(anchors))))


@torch.no_grad()
def draft_at_anchors(
    drafter: Any, example: dict[str, Any], anchors: list[int], embed_weight: torch.Tensor, lm_head_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `Drafter.draft` returns at each anchor, batched over anchors of one sequence.

    Returns logits [A, D, V], drafter hidden [A, D, d_model] and target_hidden [A, d_model]; the anchor-L block sees
    the context features of positions < L only (the root x_L is not yet seen by the target).
    """
    cfg = drafter.cfg
    ids, hidden = example["ids"], example["hidden"].float()
    n_taps, last = len(cfg.target_layer_ids), cfg.hidden_layers.index(cfg.num_target_layers - 1)
    length, count, width = ids.shape[0], len(anchors), cfg.block_size
    anchor = torch.tensor(anchors)
    context = drafter.context_kv(hidden[None, :, :n_taps], torch.arange(length)[None])
    context = [(k.expand(count, -1, -1, -1), v.expand(count, -1, -1, -1)) for k, v in context]
    block = torch.full((count, width), cfg.mask_token_id, dtype=torch.long)
    block[:, 0] = ids[anchor]
    positions = anchor[:, None] + torch.arange(width)
    visible_ctx = torch.arange(length)[None, None, :] < anchor[:, None, None]
    mask = torch.cat([visible_ctx.expand(count, width, length), torch.ones(count, width, width, dtype=torch.bool)], -1)
    out = drafter(embed_weight[block], positions, context, mask)[:, 1:]
    logits = (out.reshape(-1, out.shape[-1]) @ lm_head_weight.T).view(count, width - 1, -1)  # one GEMM, not a bmm
    return logits, out, hidden[anchor - 1, last]


def make_batch(
    drafter: Any,
    example: dict[str, Any],
    anchors: list[int],
    embed_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
    pool_size: int,
) -> AdapterBatch:
    """Draft at the anchors of one cached example and gather the teacher-forced chains and target conditionals."""
    logits, proposal, target_hidden = draft_at_anchors(drafter, example, anchors, embed_weight, lm_head_weight)
    pools = candidate_pools(logits, pool_size)
    depth, length = logits.shape[1], example["ids"].shape[0]
    pos = torch.tensor(anchors)[:, None] + torch.arange(depth)  # node at depth d: token x_{L+d}, conditional at L+d
    valid = pos < length
    pos = pos.clamp(max=length - 1)
    return AdapterBatch(
        target_hidden=target_hidden,
        proposal_hidden=proposal,
        pool_ids=pools.ids,
        pool_scores=pools.scores,
        chain=example["ids"][pos],
        target_ids=example["top_ids"][pos].long(),
        target_logprobs=example["top_logprobs"][pos].float(),
        valid=valid,
    )


def wsd_lr(step: int, total: int, peak: float, warmup: int, decay_frac: float) -> float:
    """Warmup-stable-decay: linear warmup over `warmup` steps, flat, then linear decay to 0 over the last part."""
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_steps = max(1, int(total * decay_frac))
    return peak * min(1.0, max(0.0, (total - step) / decay_steps))


OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class TrainConfig:
    """Adapter training hyper-parameters (see add_arguments for each one's meaning)."""

    steps: int = 300
    seqs_per_step: int = 4
    anchors_per_seq: int = 16
    lr: float = 2e-4
    warmup: int = 20
    decay_frac: float = 0.2
    weight_decay: float = 0.01
    kl_weight: float = 0.5
    pool_size: int = 64
    optimizer: str = "adamw"
    seed: int = 0
    save_every: int = 100

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")


def new_adapter(
    d_model: int,
    d_embed: int,
    d_rank: int,
    num_layers: int,
    num_heads: int,
    mlp_dim: int,
    pool_size: int,
    depth: int = 15,
) -> Weaver:
    """A fresh adapter whose residual starts at 0 (lm_head_query_in = 0), i.e. exactly the drafter's prior.

    depth: the drafter's D = block_size - 1, written as the config's K (the fork's DFLASH_TFM worker reads
    min(block_size - 1, K) drafter depths; 15 for the paper's block-16 drafters).
    """
    config = WeaverConfig(
        d_model=d_model,
        d_embed=d_embed,
        d_rank=d_rank,
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        K=depth,
        candidate_pool_size=pool_size,
    )
    weaver = Weaver(config)
    torch.nn.init.zeros_(weaver.lm_head_query_in.weight)
    return weaver


def concat_batches(batches: list[AdapterBatch]) -> AdapterBatch:
    """Stack batches of several sequences along the anchor dimension."""
    return AdapterBatch(*(torch.cat([getattr(b, f) for b in batches]) for f in AdapterBatch.__dataclass_fields__))


def make_optimizers(weaver: Weaver, cfg: TrainConfig) -> list[torch.optim.Optimizer]:
    """AdamW over every parameter, or the paper's split: Muon for the matrices, AdamW for the rest (norm gains, biases).

    Muon's update is scaled to AdamW's RMS (adjust_lr_fn="match_rms_adamw"), so one peak --lr serves both; its
    Newton-Schulz iteration runs in float32 on a CPU (weaver.training.muon: torch's bfloat16 one is slow there).
    """
    if cfg.optimizer == "adamw":
        return [torch.optim.AdamW(weaver.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)]
    matrices = [p for p in weaver.parameters() if p.ndim == 2]
    rest = [p for p in weaver.parameters() if p.ndim != 2]
    return [
        Muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw"),
        torch.optim.AdamW(rest, lr=cfg.lr, weight_decay=cfg.weight_decay),
    ]


def save_checkpoint(
    out_dir: Path,
    weaver: Weaver,
    optimizers: list[torch.optim.Optimizer],
    step: int,
    cfg: TrainConfig,
    inputs: dict[str, str] | None = None,
) -> None:
    """adapter.pt in the authors' format (what inference loads) + train_state.pt to resume; both written atomically.

    train_state.pt is self-contained (weights, optimizer, step, both configs, the fingerprints of the inputs): a
    workflow that deletes an unfinished adapter.pt before rerunning the job still resumes.
    """
    _atomic(out_dir / "adapter.pt", weaver.save)
    state = {
        "step": step,
        "model_config": asdict(weaver.config),
        "train_config": asdict(cfg),
        "inputs": inputs or {},
        "weaver": weaver.state_dict(),
        "optimizers": [o.state_dict() for o in optimizers],
    }
    _atomic(out_dir / "train_state.pt", lambda tmp: torch.save(state, tmp))


def train(
    weaver: Weaver,
    drafter: Any,
    store: Any,
    embed_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
    cfg: TrainConfig,
    out_dir: Path,
    log=print,
    restart_if_changed: bool = False,
) -> list[LossStats]:
    """Train (or resume training of) `weaver` on the examples of a FeatureStore; returns the per-step stats.

    A train_state.pt in out_dir is resumed (weights, optimizer, step) when weaver.training.resume allows it; with
    restart_if_changed a state of other settings is moved aside instead of refused. adapter.pt is written at the end
    even when the state was already at cfg.steps.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    drafter.requires_grad_(False).eval()
    optimizers = make_optimizers(weaver, cfg)
    start = 0
    state_path = out_dir / "train_state.pt"
    inputs = {
        "drafter": fingerprint(drafter.state_dict().values()),
        "target_embed_head": fingerprint([embed_weight, lm_head_weight]),
        "features": store_fingerprint(store),
    }
    if state_path.exists():
        state = torch.load(state_path, weights_only=True)
        if resumable(state_path, state, asdict(weaver.config), asdict(cfg), restart_if_changed, log, inputs):
            weaver.load_state_dict(state["weaver"])
            for optimizer, saved in zip(optimizers, state["optimizers"], strict=True):
                optimizer.load_state_dict(saved)
            start = int(state["step"])
            log(f"adapter: resuming at step {start}/{cfg.steps}")
    if start == cfg.steps:  # finished before: restore adapter.pt (a workflow may have deleted it), draft nothing
        _atomic(out_dir / "adapter.pt", weaver.save)
        return []
    bank = draft_bank(drafter, store, embed_weight, lm_head_weight, cfg, random.Random(cfg.seed), log)
    rng = random.Random(cfg.seed * 1_000_003 + start)  # a resumed run draws a fresh, seeded batch order
    history = []
    weaver.train()
    for step in range(start, cfg.steps):
        batch = concat_batches([unpack(b) for b in rng.choices(bank, k=cfg.seqs_per_step)])
        lr = wsd_lr(step, cfg.steps, cfg.lr, cfg.warmup, cfg.decay_frac)
        for group in (g for o in optimizers for g in o.param_groups):
            group["lr"] = lr
        loss, stats = adapter_loss(weaver, batch, embed_weight, lm_head_weight, cfg.kl_weight)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(weaver.parameters(), 1.0)
        for optimizer in optimizers:
            optimizer.step()
        history.append(stats)
        if (step + 1) % 10 == 0 or step + 1 == cfg.steps:
            log(
                f"adapter step {step + 1}/{cfg.steps}: loss {stats.loss:.4f} accept {stats.acceptance:.3f} "
                f"pool mass {stats.pool_mass:.3f}"
            )
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out_dir, weaver, optimizers, step + 1, cfg, inputs)
    return history


def draft_bank(
    drafter: Any,
    store: Any,
    embed_weight: torch.Tensor,
    lm_head_weight: torch.Tensor,
    cfg: TrainConfig,
    rng: random.Random,
    log=print,
) -> list[AdapterBatch]:
    """One AdapterBatch per training sequence (anchors_per_seq anchors each), drafted once and reused every epoch.

    The drafter is frozen, so its drafts never change; drafting (a drafter pass plus an [A, D, V] lm_head product per
    sequence) costs far more than a Weaver step, so the bank lets the adapter take many more steps per CPU minute.
    Hidden states are kept in float16 (unpack() restores float32). Drafting takes minutes to tens of minutes on a CPU,
    so it logs its progress about every tenth of the sequences.
    """
    bank, total = [], len(store)
    for n, example in enumerate(store.iterate(rng)):
        anchors = sample_anchors(example["ids"].shape[0], int(example["prompt_len"]), cfg.anchors_per_seq, rng)
        if anchors:
            batch = make_batch(drafter, example, anchors, embed_weight, lm_head_weight, cfg.pool_size)
            bank.append(_with_hidden(batch, torch.float16))
        if (n + 1) % max(1, total // 10) == 0 and n + 1 < total:
            log(f"adapter: drafting chains, {n + 1}/{total} sequences")
    if not bank:
        raise ValueError("no training sequence has a completion to anchor in: check the feature store's prompt_len")
    log(f"adapter: drafted {sum(b.chain.shape[0] for b in bank)} chains of {len(bank)} sequences")
    return bank


def unpack(batch: AdapterBatch) -> AdapterBatch:
    return _with_hidden(batch, torch.float32)


def _with_hidden(batch: AdapterBatch, dtype: torch.dtype) -> AdapterBatch:
    fields = {f: getattr(batch, f) for f in AdapterBatch.__dataclass_fields__}
    return AdapterBatch(**fields | {f: fields[f].to(dtype) for f in ("target_hidden", "proposal_hidden")})


def _atomic(target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `python -m weaver.train adapter`."""
    defaults = TrainConfig()
    parser.add_argument("--model", required=True, help="target model: registry name or local HF folder")
    parser.add_argument("--drafter", required=True, help="trained drafter folder (z-lab DFlash format), kept frozen")
    parser.add_argument(
        "--features", default=None, help="cached target features folder (default: DRAFTER/features, the drafter's)"
    )
    parser.add_argument("--out", required=True, help="output folder: adapter.pt (authors' format) + train_state.pt")
    parser.add_argument("--d-rank", type=int, default=256, help="adapter width d_rank (2048 in the paper)")
    parser.add_argument("--num-layers", type=int, default=1, help="adapter blocks (1 in the paper)")
    parser.add_argument("--num-heads", type=int, default=4, help="attention heads (16 in the paper)")
    parser.add_argument("--mlp-dim", type=int, default=512, help="SwiGLU hidden width")
    parser.add_argument("--pool-size", type=int, default=defaults.pool_size, help="candidate pool K (512 in the paper)")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="optimizer steps")
    parser.add_argument("--seqs-per-step", type=int, default=defaults.seqs_per_step, help="sequences per step")
    parser.add_argument(
        "--anchors-per-seq",
        type=int,
        default=defaults.anchors_per_seq,
        help="anchors per sequence, drafted once (see draft_bank)",
    )
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate (2e-4 in the paper)")
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=defaults.optimizer,
        help="adamw: AdamW over every parameter; muon: Muon for the matrices + AdamW for the rest (the paper's)",
    )
    parser.add_argument("--warmup", type=int, default=defaults.warmup, help="linear warmup steps")
    parser.add_argument("--decay-frac", type=float, default=defaults.decay_frac, help="fraction of steps decaying to 0")
    parser.add_argument(
        "--weight-decay", type=float, default=defaults.weight_decay, help="weight decay (of both optimizers)"
    )
    parser.add_argument("--kl-weight", type=float, default=defaults.kl_weight, help="KL weight in the LK loss; TV 1-w")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of initialisation and anchor sampling")
    parser.add_argument("--save-every", type=int, default=defaults.save_every, help="checkpoint every N steps")
    add_restart_argument(parser)


def main(args: argparse.Namespace) -> int:
    """Train an adapter for a (target, drafter) pair from cached features; resumes from --out's train_state.pt."""
    from weaver.drafter import load_drafter
    from weaver.models import load_target
    from weaver.training.features import FeatureStore

    out_dir = Path(args.out)
    if (out_dir / "adapter.pt").exists() and not (out_dir / "train_state.pt").exists():
        raise ValueError(
            f"{out_dir} holds an adapter.pt but no train_state.pt (not a run of this trainer): training would "
            "overwrite it; use another --out"
        )
    torch.manual_seed(args.seed)
    model, _ = load_target(args.model)
    embed_weight, lm_head_weight = model.embed_tokens.weight.detach().float(), model.lm_head.weight.detach().float()
    drafter = load_drafter(args.drafter)
    store = FeatureStore(args.features or Path(args.drafter) / "features")
    if store.hidden_layers != tuple(drafter.hidden_layers):
        raise ValueError(
            f"features hold target layers {store.hidden_layers} but the drafter needs {drafter.hidden_layers}: "
            "cache features for this drafter (same target and taps)"
        )
    weaver = new_adapter(
        lm_head_weight.shape[1],
        embed_weight.shape[1],
        args.d_rank,
        args.num_layers,
        args.num_heads,
        args.mlp_dim,
        args.pool_size,
        depth=drafter.cfg.block_size - 1,
    )
    cfg = TrainConfig(**{f: getattr(args, f) for f in TrainConfig.__dataclass_fields__})
    started = time.time()
    history = train(
        weaver, drafter, store, embed_weight, lm_head_weight, cfg, out_dir, restart_if_changed=args.restart_if_changed
    )
    summary = {"steps": cfg.steps, "wall_s": time.time() - started}
    if history:
        summary |= {"final": asdict(history[-1])}
    print(json.dumps(summary))
    return 0
