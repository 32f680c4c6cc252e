"""Kernels for Weaver tree drafting and verification.

Every fast op has a PyTorch reference twin `<op>_ref` with the same signature.
"""

from weaver_kernels.gdn_tree import (
    gdn_recurrent_ref,
    gdn_tree_commit_ref,
    gdn_tree_conv1d_ref,
    gdn_tree_conv_commit_ref,
    gdn_tree_verify_per_branch_ref,
    gdn_tree_verify_ref,
)

__all__ = [
    "gdn_recurrent_ref",
    "gdn_tree_commit_ref",
    "gdn_tree_conv1d_ref",
    "gdn_tree_conv_commit_ref",
    "gdn_tree_verify_per_branch_ref",
    "gdn_tree_verify_ref",
]
