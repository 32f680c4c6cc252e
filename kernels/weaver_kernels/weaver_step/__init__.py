"""The Weaver adapter's node-expansion step (METHOD.md section 3): indexed attention and pool scoring."""

from weaver_kernels.weaver_step.naive import weaver_step_attention_ref, weaver_step_scores_ref

__all__ = ["weaver_step_attention_ref", "weaver_step_scores_ref"]
