"""The Weaver adapter: an autoregressive residual over the drafter's top-K candidate pools (METHOD.md section 3).

A tiny transformer whose "prompt" is 1 + D context tokens (the target's final hidden and the drafter's hidden at each
depth) and whose "tokens" are tree nodes. Expanding node x at depth d scores the pool of depth d + 1:

    logit(c | path) = s_{d+1}(c) + W_lm[c] . q,   q = lm_head_query_in(out_norm(h_x)),   c in pool(d + 1)

Module and config names follow the authors' checkpoint format (torch.save of {'config': {...}, 'state_dict': ...}) so
a released checkpoint loads with strict=True. Two paths compute the same numbers:
- the module path (training): token_in(embed_norm(E[x])) and W_lm[c] . lm_head_query_in(.) with gradients;
- the table path (tree building): `AdapterTables` precomputes token_in(embed_norm(E)) and W_lm @ W_lmq as [V, d_rank]
  tables once, so a step gathers K rows and does one mat-vec; no [.., V] tensor is formed per node.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
import weaver_kernels
from torch import nn

ENCODER_GLOBAL_PROMPT = 3  # the authors' encoder_mode: context = [target final hidden, drafter hidden per depth]
SCORE_SIMPLE = 4  # the authors' score_head: drafter logit + W_lm[c] . q


@dataclass(frozen=True)
class WeaverConfig:
    """Checkpoint config; the keys are the authors' (`Weaver(**config)` in their SGLang fork).

    d_model: target hidden size; d_embed: target embedding size; d_rank: adapter width; mlp_dim: SwiGLU width;
    K: drafter depths the adapter reads; our engine uses all D of the block, the fork's DFLASH_TFM worker uses
    min(block_size - 1, K), so a checkpoint for SGLang needs K >= D (new_adapter writes D);
    candidate_pool_size: pool size (512 in the paper); rope_base: RoPE base over context positions 0..D and node
    positions depth + 1.
    """

    d_model: int
    d_embed: int
    d_rank: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    K: int
    candidate_pool_size: int
    encoder_mode: int = ENCODER_GLOBAL_PROMPT
    score_head: int = SCORE_SIMPLE
    activation: str = "swiglu"
    rope_base: float = 10_000.0

    def __post_init__(self) -> None:
        if self.encoder_mode != ENCODER_GLOBAL_PROMPT or self.score_head != SCORE_SIMPLE:
            raise ValueError(
                f"only encoder_mode={ENCODER_GLOBAL_PROMPT} (global prompt) and score_head={SCORE_SIMPLE} (simple "
                f"score) exist in the paper's adapter, got {self.encoder_mode} and {self.score_head}"
            )
        if self.activation != "swiglu":
            raise ValueError(f"the adapter's MLP is SwiGLU; activation must be 'swiglu', got {self.activation!r}")
        if self.d_rank % self.num_heads or (self.d_rank // self.num_heads) % 2:
            raise ValueError(
                f"d_rank {self.d_rank} must split into {self.num_heads} heads of even size (RoPE rotates pairs)"
            )
        if self.rope_base <= 0 or self.candidate_pool_size <= 0 or self.K <= 0:
            raise ValueError("rope_base, candidate_pool_size and K must be positive")

    @classmethod
    def from_dict(cls, config: dict) -> WeaverConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown Weaver config keys {unknown}; known keys are {sorted(known)}")
        return cls(**config)


class BiasRMSNorm(nn.Module):
    """RMSNorm with a learned weight AND bias, computed in fp32 (the adapter's norm)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight.float() + self.bias.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE. x: [R, S, H, hd]; positions: [R, S] int -> [R, S, H, hd]."""
    head_dim = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim)
    angles = positions.float()[..., None] * inv_freq  # [R, S, hd / 2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, :, None]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, :, None]
    xf = x.float()
    rotated = torch.cat([-xf[..., head_dim // 2 :], xf[..., : head_dim // 2]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class AdapterBlock(nn.Module):
    """Pre-norm transformer block: RoPE attention over a per-row memory plus the rows' own tokens, SwiGLU MLP."""

    def __init__(self, config: WeaverConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.d_rank // config.num_heads
        self.rope_base = config.rope_base
        self.norm_attn = BiasRMSNorm(config.d_rank)
        self.qkv_proj = nn.Linear(config.d_rank, 3 * config.d_rank, bias=False)
        self.o_proj = nn.Linear(config.d_rank, config.d_rank, bias=False)
        self.norm_mlp = BiasRMSNorm(config.d_rank)
        self.gate_up_proj = nn.Linear(config.d_rank, 2 * config.mlp_dim)
        self.down_proj = nn.Linear(config.mlp_dim, config.d_rank)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mem_k: torch.Tensor,
        mem_v: torch.Tensor,
        mem_mask: torch.Tensor,
        self_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One block over S new tokens per row.

        Args:
            x: [R, S, d_rank] inputs; positions: [R, S] RoPE positions.
            mem_k, mem_v: [R, P, H, hd] cached (already rotated) keys / values each row may attend to.
            mem_mask: [R, S, P] bool, which memory entries each token sees.
            self_mask: [S, S] bool, which of the row's own new tokens each token sees.

        Returns:
            x: [R, S, d_rank]; k, v: [R, S, H, hd] (k rotated) for later tokens to attend to.
        """
        rows, steps, d_rank = x.shape
        q, k, v = self.project(x, positions)
        keys = torch.cat([mem_k, k], dim=1)
        values = torch.cat([mem_v, v], dim=1)
        mask = torch.cat([mem_mask, self_mask.expand(rows, steps, steps)], dim=2)  # [R, S, P + S]
        scores = torch.einsum("rshd,rthd->rhst", q.float(), keys.float()) * self.head_dim**-0.5
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
        attn = torch.softmax(scores, dim=-1).to(x.dtype)
        y = torch.einsum("rhst,rthd->rshd", attn, values).reshape(rows, steps, d_rank)
        return self.finish(x, y), k, v

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [R, S, d_rank]; positions: [R, S] -> q, k (rotated), v: [R, S, H, hd]."""
        rows, steps, _ = x.shape
        q, k, v = self.qkv_proj(self.norm_attn(x)).view(rows, steps, 3, self.num_heads, self.head_dim).unbind(dim=2)
        return apply_rope(q, positions, self.rope_base), apply_rope(k, positions, self.rope_base), v

    def finish(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Attention residual and SwiGLU MLP. x, y (attention output, heads merged): [..., d_rank] -> [..., d_rank]."""
        x = x + self.o_proj(y)
        gate, up = self.gate_up_proj(self.norm_mlp(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)

    def step(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        node_k: torch.Tensor,
        node_v: torch.Tensor,
        new_slots: torch.Tensor,
        seen_slots: torch.Tensor,
    ) -> torch.Tensor:
        """One block over W new tree nodes through the `weaver_kernels` step (METHOD.md section 3).

        Args:
            x: [W, d_rank] node inputs; positions: [W] = depth + 1.
            ctx_k, ctx_v: [C, H, hd] this layer's context K/V.
            node_k, node_v: [M, H, hd] this layer's node cache; the new nodes' K/V are written at new_slots [W].
            seen_slots: [W, A] int64 slots each node attends to besides the context (proper ancestors and
                itself), -1 = padding.

        Returns:
            x: [W, d_rank].
        """
        q, k, v = (t[:, 0] for t in self.project(x[:, None], positions[:, None]))
        node_k[new_slots] = k
        node_v[new_slots] = v
        y = weaver_kernels.weaver_step_attention(q, ctx_k, ctx_v, node_k, node_v, seen_slots)
        return self.finish(x, y.reshape(x.shape))


@dataclass(frozen=True)
class ContextKV:
    """Per-layer K/V of the 1 + D context tokens. keys, values: [L, R, 1 + D, H, hd]."""

    keys: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True)
class AdapterTables:
    """Precomputed per-target tables.

    token: [V, d_rank] = token_in(embed_norm(E_target)), a node's input row.
    residual: [V, d_rank] = W_lm @ W_lmq, so that W_lm[c] . lm_head_query_in(h) = residual[c] . h.
    """

    token: torch.Tensor
    residual: torch.Tensor


@dataclass(frozen=True)
class CandidatePools:
    """Top-K candidate pools of the drafter's marginals, one per depth d = 1..D.

    ids: [..., D, K] int64 token ids (-1 = padding); scores: [..., D, K] raw drafter logits s_d(c) (-inf at padding).
    """

    ids: torch.Tensor
    scores: torch.Tensor


def candidate_pools(logits: torch.Tensor, pool_size: int) -> CandidatePools:
    """Top-K pools of raw drafter logits [..., D, V]; pools narrower than pool_size are padded with id -1 / -inf."""
    k = min(pool_size, logits.shape[-1])
    scores, ids = logits.float().topk(k, dim=-1)
    if k < pool_size:
        pad = pool_size - k
        scores = F.pad(scores, (0, pad), value=float("-inf"))
        ids = F.pad(ids, (0, pad), value=-1)
    return CandidatePools(ids=ids, scores=scores)


@dataclass(frozen=True)
class BoundAdapter:
    """An adapter with the tables of one target, ready for tree building (`weaver.builders`)."""

    weaver: Weaver
    tables: AdapterTables
    pool_size: int
    children: int = 8  # fan-out of the weaver builder: top pool children per expanded node (8 in the paper)


class Weaver(nn.Module):
    """The Weaver adapter (module names are the authors' so that their checkpoints load with strict=True)."""

    def __init__(self, config: WeaverConfig) -> None:
        super().__init__()
        self.config = config
        self.output_norm = BiasRMSNorm(config.d_model)
        self.embed_norm = BiasRMSNorm(config.d_embed)
        self.token_in = nn.Linear(config.d_embed, config.d_rank)
        self.proposal_in = nn.Linear(config.d_model, config.d_rank)
        self.blocks = nn.ModuleList(AdapterBlock(config) for _ in range(config.num_layers))
        self.out_norm = BiasRMSNorm(config.d_rank)
        self.lm_head_query_in = nn.Linear(config.d_rank, config.d_model, bias=False)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path) -> None:
        """Write the authors' format: torch.save({'config': {...}, 'state_dict': ...}).

        The fork loads it with torch.load(path, map_location=device) (weights_only by default in torch >= 2.6), then
        `Weaver(**config).to(device, dtype)` and load_state_dict(strict=True), which casts to the serving dtype: so the
        config holds only Python int / float / str and the tensors are written on the CPU in their training dtype.
        """
        casts = {"int": int, "float": float, "str": str}  # the field annotations (strings: postponed evaluation)
        config = {f.name: casts[f.type](getattr(self.config, f.name)) for f in fields(self.config)}
        state = {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()}
        torch.save({"config": config, "state_dict": state}, path)

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> Weaver:
        """Load a checkpoint in the authors' format with strict=True."""
        payload = torch.load(path, map_location=map_location, weights_only=True)
        if not isinstance(payload, dict) or "config" not in payload or "state_dict" not in payload:
            raise ValueError(
                f"{path} is not a Weaver checkpoint: expected torch.save({{'config': ..., 'state_dict': ...}})"
            )
        model = cls(WeaverConfig.from_dict(dict(payload["config"])))
        model.load_state_dict(payload["state_dict"], strict=True)
        return model.eval()

    # ------------------------------------------------------------------ tables and pools
    @torch.no_grad()
    def tables(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> AdapterTables:
        """Precompute the [V, d_rank] tables from the target's embed_tokens.weight and lm_head.weight [V, d_model]."""
        if embed_weight.shape[-1] != self.config.d_embed or lm_head_weight.shape[-1] != self.config.d_model:
            raise ValueError(
                f"target embeddings {tuple(embed_weight.shape)} / lm_head {tuple(lm_head_weight.shape)} do not match "
                f"the adapter (d_embed={self.config.d_embed}, d_model={self.config.d_model}): wrong target?"
            )
        token = self.token_in(self.embed_norm(embed_weight.float()))
        residual = lm_head_weight.float() @ self.lm_head_query_in.weight.float()
        return AdapterTables(token=token.contiguous(), residual=residual.contiguous())

    def bind(
        self,
        embed_weight: torch.Tensor,
        lm_head_weight: torch.Tensor,
        pool_size: int | None = None,
        children: int = 8,
    ) -> BoundAdapter:
        """Attach a target (embed_tokens.weight, lm_head.weight [V, d_model]) for tree building.

        children: fan-out of the weaver builder (top children published per expanded node; METHOD.md section 4 uses
        8). A weak drafter spreads the target's mass wide at depth 1, where a larger fan-out lets the tree follow it.
        """
        if children < 1:
            raise ValueError(f"children must be >= 1 (top pool children per expanded node), got {children}")
        pool = pool_size or self.config.candidate_pool_size
        return BoundAdapter(self.eval(), self.tables(embed_weight, lm_head_weight), pool, children)

    def pools(self, logits: torch.Tensor, pool_size: int | None = None) -> CandidatePools:
        """Candidate pools of a draft block's logits [D, V] (top-K per depth)."""
        return candidate_pools(logits, pool_size or self.config.candidate_pool_size)

    # ------------------------------------------------------------------ context
    def encode_context(self, target_hidden: torch.Tensor, proposal_hidden: torch.Tensor) -> ContextKV:
        """Run the 1 + D context tokens causally at positions 0..D and keep their K/V per layer.

        Args:
            target_hidden: [R, d_model] target final hidden at the last committed position.
            proposal_hidden: [R, D, d_model] drafter final hidden per depth.
        """
        feats = torch.cat([target_hidden[:, None], proposal_hidden], dim=1)
        x = self.proposal_in(self.output_norm(feats))  # [R, 1 + D, d_rank]
        rows, prefix, _ = x.shape
        positions = torch.arange(prefix, device=x.device).expand(rows, prefix)
        causal = torch.ones(prefix, prefix, dtype=torch.bool, device=x.device).tril()
        head_dim = self.config.d_rank // self.config.num_heads
        empty = x.new_zeros(rows, 0, self.config.num_heads, head_dim)
        no_mem = torch.zeros(rows, prefix, 0, dtype=torch.bool, device=x.device)
        keys, values = [], []
        for block in self.blocks:
            x, k, v = block(x, positions, empty, empty, no_mem, causal)
            keys.append(k)
            values.append(v)
        return ContextKV(keys=torch.stack(keys), values=torch.stack(values))

    # ------------------------------------------------------------------ nodes
    def forward_tokens(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        context: ContextKV,
        mem_k: torch.Tensor | None = None,
        mem_v: torch.Tensor | None = None,
        mem_mask: torch.Tensor | None = None,
        self_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run node tokens through the blocks; every token sees the whole context.

        Args:
            x: [R, S, d_rank] node inputs (token_in(embed_norm(E[x]))); positions: [R, S] = depth + 1.
            context: K/V [L, R, 1 + D, H, hd] of each row's context.
            mem_k, mem_v: [L, R, A, H, hd] extra cached node K/V (tree ancestors); mem_mask: [R, S, A].
            self_mask: [S, S] among the S new tokens (default: causal, a teacher-forced chain).

        Returns:
            h: [R, S, d_rank] final hidden (before out_norm); k, v: [L, R, S, H, hd] of the new tokens.
        """
        rows, steps, _ = x.shape
        prefix = context.keys.shape[2]
        if self_mask is None:
            self_mask = torch.ones(steps, steps, dtype=torch.bool, device=x.device).tril()
        ctx_mask = torch.ones(rows, steps, prefix, dtype=torch.bool, device=x.device)
        keys, values = [], []
        for i, block in enumerate(self.blocks):
            mk, mv, mm = context.keys[i], context.values[i], ctx_mask
            if mem_k is not None:
                mk, mv = torch.cat([mk, mem_k[i]], dim=1), torch.cat([mv, mem_v[i]], dim=1)
                mm = torch.cat([ctx_mask, mem_mask], dim=2)
            x, k, v = block(x, positions, mk, mv, mm, self_mask)
            keys.append(k)
            values.append(v)
        return x, torch.stack(keys), torch.stack(values)

    @torch.no_grad()
    def step(
        self,
        x: torch.Tensor,
        depths: torch.Tensor,
        context: ContextKV,
        node_keys: torch.Tensor,
        node_values: torch.Tensor,
        new_slots: torch.Tensor,
        seen_slots: torch.Tensor,
    ) -> torch.Tensor:
        """Expand W tree nodes at once: the fast twin of `forward_tokens` for one token per node (tree building).

        Args:
            x: [W, d_rank] node inputs (rows of AdapterTables.token); depths: [W] node depths (RoPE at depth + 1).
            context: K/V [L, 1, 1 + D, H, hd] of the draft block's context (one row).
            node_keys, node_values: [L, M, H, hd] node cache; the new nodes' K/V are written at new_slots [W].
            seen_slots: [W, A] int64 node slots each node attends to (proper ancestors and itself), -1 = padding.

        Returns:
            h: [W, d_rank] final hidden (before out_norm); score it with `pool_scores`.
        """
        if context.keys.shape[1] != 1:
            raise ValueError(f"step expands nodes of one draft block: context rows must be 1, got {context.keys.shape}")
        positions = depths + 1
        for i, block in enumerate(self.blocks):
            x = block.step(
                x,
                positions,
                context.keys[i, 0],
                context.values[i, 0],
                node_keys[i],
                node_values[i],
                new_slots,
                seen_slots,
            )
        return x

    def pool_scores(
        self, h: torch.Tensor, tables: AdapterTables, pool_ids: torch.Tensor, pool_scores: torch.Tensor
    ) -> torch.Tensor:
        """Table path through the `weaver_kernels` step. h: [W, d_rank]; pool_ids (-1 = padding), pool_scores:
        [W, K] -> logits [W, K] = s(c) + residual[c] . out_norm(h), -inf at padding; gathers K table rows per node."""
        return weaver_kernels.weaver_step_scores(self.out_norm(h), tables.residual, pool_ids, pool_scores)

    def pool_logits(self, h: torch.Tensor, pools: CandidatePools, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """Module path (training). h: [..., d_rank]; pools.ids / scores: [..., K]; lm_head_weight: [V, d_model].

        Returns [..., K] = s(c) + W_lm[c] . lm_head_query_in(out_norm(h)), -inf at padding.

        The pools of a batch overlap heavily (a few thousand distinct tokens over ~1000 pools of 512 on SmolLM2), so
        every query is scored against the U distinct pool tokens in one [M, d_model] x [d_model, U] product and the
        pools gather from that [M, U] score table, instead of gathering an [M, K, d_model] copy of lm_head rows
        (1.1 GB per step there; 25x slower on a CPU). U <= V, so the table never exceeds [M, V].
        """
        query = self.lm_head_query_in(self.out_norm(h))  # [..., d_model]
        ids = pools.ids.clamp(min=0)
        tokens, index = ids.unique(return_inverse=True)  # [U] distinct pool tokens; index: [..., K] into them
        scores = query.reshape(-1, query.shape[-1]) @ lm_head_weight[tokens].T  # [M, U]
        residual = scores.gather(1, index.reshape(scores.shape[0], -1)).reshape(ids.shape)  # [..., K]
        return pools.scores + residual
