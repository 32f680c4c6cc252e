"""Gated DeltaNet over draft trees: verify (rollback-free), commit, tree conv and the per-branch baseline."""

from weaver_kernels.gdn_tree.naive import (
    ancestor_masks,
    gdn_recurrent_ref,
    gdn_tree_commit_ref,
    gdn_tree_conv1d_ref,
    gdn_tree_conv_commit_ref,
    gdn_tree_verify_per_branch_ref,
    gdn_tree_verify_ref,
    path_to,
    tree_path_cumsum,
)

__all__ = [
    "ancestor_masks",
    "gdn_recurrent_ref",
    "gdn_tree_commit_ref",
    "gdn_tree_conv1d_ref",
    "gdn_tree_conv_commit_ref",
    "gdn_tree_verify_per_branch_ref",
    "gdn_tree_verify_ref",
    "path_to",
    "tree_path_cumsum",
]
