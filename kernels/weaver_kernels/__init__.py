"""Kernels for Weaver tree drafting and verification.

Every fast op `<op>` has a PyTorch reference twin `<op>_ref` with the same signature; `<op>` goes through one dispatch
point (weaver_kernels.dispatch: `use_backend`, WEAVER_KERNELS=auto|ref|triton|cuda). All ops take the single-sequence
shapes documented on the refs or the same shapes with a leading batch dim B (parents [B, N] or shared [N], leaf [B]).
"""

from __future__ import annotations

import torch

from weaver_kernels.dispatch import call, resolve, use_backend
from weaver_kernels.gdn_tree import (
    gdn_recurrent_ref,
    gdn_tree_commit_ref,
    gdn_tree_conv1d_ref,
    gdn_tree_conv_commit_ref,
    gdn_tree_verify_per_branch_ref,
    gdn_tree_verify_ref,
)
from weaver_kernels.tree_attention import tree_attention_ref
from weaver_kernels.weaver_step import weaver_step_attention_ref, weaver_step_scores_ref


def gdn_tree_verify(q, k, v, g, beta, parents, initial_state) -> torch.Tensor:
    """Rollback-free GDN tree verify (fused masked solve); shapes as gdn_tree_verify_ref. Returns o [N, HV, V]."""
    return call("gdn_tree_verify", (3, 3, 3, 2, 2, 1, 3), q, k, v, g, beta, parents, initial_state)


def gdn_tree_verify_per_branch(q, k, v, g, beta, parents, initial_state) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-branch recurrent baseline; shapes as gdn_tree_verify_per_branch_ref. Returns (o, states [N, HV, K, V])."""
    return call("gdn_tree_verify_per_branch", (3, 3, 3, 2, 2, 1, 3), q, k, v, g, beta, parents, initial_state)


def gdn_tree_commit(k, v, g, beta, parents, initial_state, leaf) -> torch.Tensor:
    """State [HV, K, V] after the accepted path root..leaf; shapes as gdn_tree_commit_ref."""
    return call("gdn_tree_commit", (3, 3, 2, 2, 1, 3, 0), k, v, g, beta, parents, initial_state, leaf)


def gdn_tree_conv1d(x, weight, bias, parents, conv_state, activation="silu") -> torch.Tensor:
    """Tree-aware causal depthwise conv; shapes as gdn_tree_conv1d_ref. Returns y [N, C]."""
    return call("gdn_tree_conv1d", (2, None, None, 1, 2, None), x, weight, bias, parents, conv_state, activation)


def tree_attention(q, k, v, k_prefix, v_prefix, parents, scale=None) -> torch.Tensor:
    """Tree tokens over committed prefix + ancestor-or-self block; shapes as tree_attention_ref. Returns [N, HQ, D]."""
    return call("tree_attention", (3, 3, 3, 3, 3, 1, None), q, k, v, k_prefix, v_prefix, parents, scale)


def weaver_step_attention(q, ctx_k, ctx_v, node_k, node_v, slots, scale=None) -> torch.Tensor:
    """Weaver step: new nodes over context + their node slots; shapes as weaver_step_attention_ref. [W, HQ, Dh]."""
    return call("weaver_step_attention", (3, 3, 3, 3, 3, 2, None), q, ctx_k, ctx_v, node_k, node_v, slots, scale)


def weaver_step_scores(query, table, pool_ids, pool_logits) -> torch.Tensor:
    """Weaver step: pool logits s(c) + table[c] . query; shapes as weaver_step_scores_ref. Returns [W, K]."""
    return call("weaver_step_scores", (2, None, 2, 2), query, table, pool_ids, pool_logits)


__all__ = [
    "gdn_recurrent_ref",
    "gdn_tree_commit",
    "gdn_tree_commit_ref",
    "gdn_tree_conv1d",
    "gdn_tree_conv1d_ref",
    "gdn_tree_conv_commit_ref",
    "gdn_tree_verify",
    "gdn_tree_verify_per_branch",
    "gdn_tree_verify_per_branch_ref",
    "gdn_tree_verify_ref",
    "resolve",
    "tree_attention",
    "tree_attention_ref",
    "use_backend",
    "weaver_step_attention",
    "weaver_step_attention_ref",
    "weaver_step_scores",
    "weaver_step_scores_ref",
]
