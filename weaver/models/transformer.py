"""The target decoder: one readable stack for every family, with explicit positions, masks and caches.

forward(input_ids [B, T], cache)  appends T tokens at positions seq_len + arange(T)
verify(tree, cache)               all N tree nodes in one pass: positions seq_len + depth, mask = committed prefix
                                  + ancestor-or-self (METHOD.md 6); GDN layers by the rollback-free tree solve (7)
commit(cache, path)               keeps the accepted root..leaf path: compacts K/V, advances GDN state and conv
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from weaver.models.attention import Attention
from weaver.models.cache import Cache, Pass
from weaver.models.config import LINEAR_ATTENTION, ModelConfig
from weaver.models.gdn import GatedDeltaNet
from weaver.models.layers import MLP, Linear, RMSNorm, Rotary
from weaver.tree import Tree

_FUSABLE = (Attention, MLP)  # modules with fuse_projections() / unfuse_projections()
PACK_MAX_BYTES = 2 << 30  # pre-pack CPU weights (layers.PackedWeight) only for models up to this size: it doubles them


@dataclass(frozen=True)
class ModelOutput:
    """logits [B, T, V]; hidden [B, T, L, d]: outputs of the requested decoder layers, or None."""

    logits: torch.Tensor
    hidden: torch.Tensor | None


class DecoderLayer(nn.Module):
    """Pre-norm block: h + mixer(norm(h)), then h + mlp(norm(h)); the mixer is attention or Gated DeltaNet."""

    def __init__(self, config: ModelConfig, layer_type: str) -> None:
        super().__init__()
        self.is_linear = layer_type == LINEAR_ATTENTION
        zc = config.hybrid
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centred=zc)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centred=zc)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = Attention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    @property
    def mixer(self) -> Attention | GatedDeltaNet:
        return self.linear_attn if self.is_linear else self.self_attn

    def forward(self, h: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache, p: Pass) -> torch.Tensor:
        """h [B, T, d] -> [B, T, d]."""
        h = h + self.mixer(self.input_layernorm(h), rope, cache, p)
        return h + self.mlp(self.post_attention_layernorm(h))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if len(config.layer_types) != config.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(config.layer_types)} entries for {config.num_hidden_layers} layers: "
                "give one type per layer"
            )
        self.config = config
        # given its tensor, nn.Embedding skips its random init: under torch.device("meta") (the loaders) that init's
        # first call would import torch._dynamo, ~1.3 s of every process start
        embedding = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=embedding)
        if not embedding.is_meta:
            nn.init.normal_(embedding)  # nn.Embedding's own initialisation
        self.layers = nn.ModuleList(DecoderLayer(config, kind) for kind in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, zero_centred=config.hybrid)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = Rotary(config.rotary_dim, config.rope_theta)
        self.inference_layout = False  # see prepare_for_inference
        self._pack = False

    def prepare_for_inference(self, pack: bool | None = None) -> None:
        """Weight layout for fast decoding and verification (the loaders call it; it survives .to(), see _apply).

        - fuse the projections that read the same input (attention q|k|v, MLP gate|up): one GEMV per group;
        - store the fused weights and the LM head input-major (contiguous [in, out]), the faster GEMV (fuse_linears);
        - on a CPU in fp32, pre-pack the large weights for oneDNN (layers.PackedWeight), used for 2-128 rows: the
          shapes of a verify, a batched decode and a prefill chunk. `pack` None packs models of at most
          PACK_MAX_BYTES of parameters (the packed copies double the weights' memory); True / False force it.
        Values, module names and the state_dict keys stay those of the checkpoint: the fused weights alias the
        separate parameters, which become views with other strides, and a tied LM head stays tied to the embedding.
        The fused and packed weights are used only with autograd off, so training code sees and updates the
        separate projections.
        """
        if pack is None:
            pack = sum(p.numel() * p.element_size() for p in self.parameters()) <= PACK_MAX_BYTES
        self._pack = pack
        head = self.lm_head
        tied = head.weight is self.embed_tokens.weight
        with torch.no_grad():
            head.weight = nn.Parameter(head.weight.t().contiguous().t(), requires_grad=head.weight.requires_grad)
        if tied:
            self.embed_tokens.weight = head.weight
        for module in self.modules():
            if isinstance(module, _FUSABLE):
                module.fuse_projections(pack)
            elif isinstance(module, Linear):
                module.pack(pack)
        self.inference_layout = True

    def _apply(self, fn, recurse: bool = True):
        """.to() / .cuda() / .half(): move the separate parameters only, then fuse again on the new device or dtype,
        so the fused weights never exist twice (as moved copies beside the moved parameters)."""
        if not self.inference_layout:
            return super()._apply(fn, recurse)
        for module in self.modules():
            if isinstance(module, _FUSABLE):
                module.unfuse_projections()
            elif isinstance(module, Linear):
                module.pack(False)
        super()._apply(fn, recurse)
        self.prepare_for_inference(self._pack)
        return self

    def new_cache(self, max_seq_len: int, max_tree_nodes: int = 1, batch_size: int = 1) -> Cache:
        """Static buffers for `max_seq_len` committed tokens plus `max_tree_nodes` scratch slots for a verify."""
        if min(max_seq_len, max_tree_nodes, batch_size) < 1:
            raise ValueError(
                f"max_seq_len, max_tree_nodes and batch_size must be >= 1, got {max_seq_len}, {max_tree_nodes}, "
                f"{batch_size}"
            )
        w = self.embed_tokens.weight
        layers = [
            layer.linear_attn.new_cache(batch_size, max_tree_nodes, w.dtype, w.device)
            if layer.is_linear
            else layer.self_attn.new_cache(batch_size, max_seq_len + max_tree_nodes, w.dtype, w.device)
            for layer in self.layers
        ]
        return Cache(layers, max_seq_len=max_seq_len, max_tree_nodes=max_tree_nodes, batch_size=batch_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: Cache | None = None,
        hidden_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> ModelOutput:
        """input_ids [B, T] appended after the cache (positions seq_len + arange(T)); cache None = fresh causal pass.

        last_logits_only: return logits [B, 1, V] of the last position only (a prefill needs no more; the LM head
        over every prompt position would dominate time to first token).
        """
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [B, T] with T >= 1, got shape {tuple(input_ids.shape)}")
        self._check_tokens(input_ids)
        b, t = input_ids.shape
        start = 0
        mask = None
        if cache is not None:
            self._check_idle(cache)
            if b != cache.batch_size:
                raise ValueError(f"input batch {b} != cache batch_size {cache.batch_size}: make the cache to match")
            start = cache.seq_len
            if start + t > cache.max_seq_len:
                raise ValueError(
                    f"{start} cached + {t} new tokens exceed the cache's max_seq_len {cache.max_seq_len}: "
                    "make a larger cache or generate fewer tokens"
                )
            if t > 1:  # causal over the new tokens, everything committed is visible
                slots = torch.arange(start + t, device=input_ids.device)
                mask = slots[None, :] <= (start + torch.arange(t, device=input_ids.device))[:, None]
        elif t > self.config.max_position_embeddings:
            raise ValueError(f"{t} tokens exceed the model's context of {self.config.max_position_embeddings}")
        positions = start + torch.arange(t, device=input_ids.device)
        out = self._run(input_ids, positions, cache, Pass(start, mask, None), hidden_layers, last_logits_only)
        if cache is not None:
            cache.seq_len += t
        return out

    def verify(self, tree: Tree, cache: Cache, hidden_layers: Sequence[int] = ()) -> ModelOutput:
        """Run all N nodes of `tree` (node 0 = the last committed token, not yet seen) -> logits [1, N, V].

        Writes the nodes' K/V to scratch slots and stashes GDN inputs; nothing becomes committed until `commit`.
        """
        self._check_idle(cache)
        n = tree.num_nodes
        if cache.batch_size != 1:
            raise ValueError(f"verify works on one sequence; the cache has batch_size {cache.batch_size}")
        if n > cache.max_tree_nodes:
            raise ValueError(f"tree has {n} nodes, over the cache's max_tree_nodes {cache.max_tree_nodes}")
        self._check_tokens(tree.tokens)
        start = cache.seq_len
        device = self.embed_tokens.weight.device
        prefix = torch.ones(n, start, dtype=torch.bool, device=device)
        mask = torch.cat([prefix, tree.ancestor_mask().to(device)], dim=1)
        parents = tree.parents.to(device)
        positions = tree.positions(start).to(device)
        out = self._run(tree.tokens.to(device)[None], positions, cache, Pass(start, mask, parents), hidden_layers)
        cache.pending = tree
        return out

    def commit(self, cache: Cache, path: Sequence[int] | torch.Tensor) -> None:
        """Accept the nodes `path` (root..leaf of the last verify): cache.seq_len += len(path)."""
        tree = cache.pending
        if tree is None:
            raise RuntimeError("commit without a pending verify: call model.verify(tree, cache) first")
        path = [int(i) for i in path]
        if not path or path[0] != 0 or any(tree.parents[c] != p for p, c in zip(path, path[1:], strict=False)):
            raise ValueError(f"path {path} is not a root-to-node path of the last verified tree (it must start at 0)")
        if cache.seq_len + len(path) > cache.max_seq_len:
            raise ValueError(
                f"committing {len(path)} tokens after {cache.seq_len} exceeds max_seq_len {cache.max_seq_len}: "
                "make a larger cache"
            )
        device = self.embed_tokens.weight.device
        index = torch.tensor(path, dtype=torch.long, device=device)
        parents = tree.parents.to(device)
        for layer, layer_cache in zip(self.layers, cache.layers, strict=True):
            if layer.is_linear:
                layer.linear_attn.commit(layer_cache, parents, path[-1])
            else:
                layer.self_attn.commit(layer_cache, cache.seq_len, index)
        cache.seq_len += len(path)
        cache.pending = None

    def _run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache | None,
        p: Pass,
        hidden_layers: Sequence[int],
        last_logits_only: bool = False,
    ) -> ModelOutput:
        """ids [B, T], positions [T] -> logits [B, T, V] (and the requested layers' outputs [B, T, L, d])."""
        last = int(positions.max())
        if last >= self.config.max_position_embeddings:
            raise ValueError(f"position {last} is beyond the model's context of {self.config.max_position_embeddings}")
        want = set(hidden_layers)
        bad = [i for i in want if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"hidden_layers {bad} out of range: the model has layers 0..{len(self.layers) - 1}")
        rope = self.rotary(positions)
        h = self.embed_tokens(ids)
        kept = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, None if cache is None else cache.layers[i], p)
            if i in want:
                kept[i] = h
        hidden = torch.stack([kept[i] for i in hidden_layers], dim=2) if hidden_layers else None
        if last_logits_only:
            h = h[:, -1:]
        return ModelOutput(self.lm_head(self.norm(h)), hidden)

    def _check_idle(self, cache: Cache) -> None:
        if cache.pending is not None:
            raise RuntimeError(
                "the cache has an uncommitted verify: call model.commit(cache, path) or cache.discard_pending() first"
            )

    def _check_tokens(self, ids: torch.Tensor) -> None:
        v = self.config.vocab_size
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= v):
            raise ValueError(
                f"token ids must lie in [0, {v}) (the target's vocabulary), got [{int(ids.min())}, {int(ids.max())}]: "
                "is the input from another tokenizer?"
            )
