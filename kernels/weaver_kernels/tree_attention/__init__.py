"""Attention of tree tokens over the committed prefix plus their ancestors (METHOD.md section 6)."""

from weaver_kernels.tree_attention.naive import tree_attention_ref

__all__ = ["tree_attention_ref"]
