"""PyTorch references for Gated DeltaNet over a draft tree (METHOD.md section 7).

Notation (per value head; a key head is shared by HV // H value heads, GQA):
    alpha_t = exp(g_t),  S <- alpha_t S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t
Tree form: G_i = g_i + G_parent(i) (path cumsum), and with the ancestor masks
    (I + A) U = beta * (V - e^G * K S0),   A_ij = beta_i e^(G_i - G_j) k_i . k_j   (j a proper ancestor of i)
    o_i = e^(G_i) S0^T q_i + sum_(j ancestor-or-self of i) e^(G_i - G_j) (q_i . k_j) u_j
Cross-branch entries of (I + A)^-1 vanish, so every root-to-leaf path gets exactly the sequential answer.

Shapes: N tree nodes (node 0 = first new token, parents[0] = -1), H key heads, HV value heads, K key dim, V value dim.
Every public function accepts an optional leading batch dim B on all tensors (parents [B, N] or shared [N]).
"""

from __future__ import annotations

import torch

from weaver_kernels.batching import batched


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """[..., H, K] -> [..., HV, K] by repeating each key head HV // H times (GQA)."""
    h = x.shape[-2]
    if hv % h:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({h})")
    return x.repeat_interleave(hv // h, dim=-2)


def ancestor_masks(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] parents -> (proper-ancestor mask [N, N], ancestor-or-self mask [N, N]); mask[i, j]: j above i.

    Transitive closure of the parent relation by repeated squaring: after s squarings R holds every ancestor within
    distance 2^s, so ceil(log2 N) matmuls suffice and nothing syncs with the host.
    """
    n = parents.numel()
    idx = torch.arange(n, device=parents.device)
    eye = torch.eye(n, dtype=torch.bool, device=parents.device)
    reach = eye.float()
    has_parent = parents >= 0
    reach[idx[has_parent], parents[has_parent]] = 1.0
    for _ in range(max(n - 1, 1).bit_length()):
        reach = (reach @ reach).clamp_(max=1.0)
    anc_self = reach > 0
    return anc_self & ~eye, anc_self


def tree_path_cumsum(g: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """[N, HV] log-decays -> [N, HV] path prefix sums G_i = g_i + G_parent(i) (= ancestor-or-self mask @ g)."""
    _, anc_self = ancestor_masks(parents)
    return anc_self.to(g.dtype) @ g


def path_to(parents: torch.Tensor, leaf: int) -> list[int]:
    """Node indices from node 0 down to `leaf`."""
    plist = parents.tolist()
    path = []
    while leaf >= 0:
        path.append(leaf)
        leaf = plist[leaf]
    return path[::-1]


@batched(3, 3, 3, 2, 2, 3)
def gdn_recurrent_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, initial_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential gated delta rule over a chain of T tokens.

    Args:
        q, k: [T, H, K] (normalised; q already scaled). v: [T, HV, V]. g, beta: [T, HV]. initial_state: [HV, K, V].
    Returns:
        o [T, HV, V] and the final state [HV, K, V]. Accumulates in fp32 (fp64 inputs stay fp64).
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    hv = v.shape[1]
    qe, ke = _expand_heads(q, hv).to(acc), _expand_heads(k, hv).to(acc)
    s = initial_state.to(acc).clone()
    o = torch.empty(v.shape, dtype=acc, device=v.device)
    for t in range(q.shape[0]):
        s = s * g[t].to(acc).exp()[:, None, None]
        u = beta[t].to(acc)[:, None] * (v[t].to(acc) - torch.einsum("hkv,hk->hv", s, ke[t]))
        s = s + ke[t][:, :, None] * u[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", s, qe[t])
    return o.to(v.dtype), s.to(initial_state.dtype)


def _tree_pseudo_values(k, v, g, beta, parents, initial_state):
    """Solve (I + A) U = beta (V - e^G K S0) on the tree.

    Returns (U [HV, N, V], G [HV, N], k_e [HV, N, K], ancestor-or-self mask [N, N], accumulation dtype).
    """
    acc = torch.float64 if k.dtype == torch.float64 else torch.float32
    hv = v.shape[1]
    ke = _expand_heads(k, hv).to(acc).transpose(0, 1)  # [HV, N, K]
    vv = v.to(acc).transpose(0, 1)  # [HV, N, V]
    anc, anc_self = ancestor_masks(parents)
    G = (anc_self.to(acc) @ g.to(acc)).transpose(0, 1)  # [HV, N] path cumsum
    b = beta.to(acc).transpose(0, 1)  # [HV, N]
    s0 = initial_state.to(acc)
    # ratios e^(G_i - G_j) <= 1: mask with -inf before exp so no overflow on cross-branch pairs
    ratio = (G[:, :, None] - G[:, None, :]).masked_fill(~anc, float("-inf")).exp()
    A = b[:, :, None] * ratio * (ke @ ke.transpose(1, 2))
    rhs = b[:, :, None] * (vv - G.exp()[:, :, None] * (ke @ s0))
    eye = torch.eye(A.shape[-1], dtype=acc, device=A.device)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    return U, G, ke, anc_self, acc


@batched(3, 3, 3, 2, 2, 1, 3)
def gdn_tree_verify_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
) -> torch.Tensor:
    """Outputs of every tree node, rollback-free (no state is written).

    Args:
        q, k: [N, H, K] L2-normalised (q already scaled by K^-1/2). v: [N, HV, V]. g: [N, HV] log-decay (<= 0).
        beta: [N, HV] in (0, 1). parents: [N] int64, parents[0] = -1, parents[i] < i.
        initial_state: [HV, K, V] committed state before node 0.
    Returns:
        o: [N, HV, V] with o_i = S_i^T q_i, S_i the state after the path node 0..i.
    """
    U, G, ke, anc_self, acc = _tree_pseudo_values(k, v, g, beta, parents, initial_state)
    hv = v.shape[1]
    qe = _expand_heads(q, hv).to(acc).transpose(0, 1)  # [HV, N, K]
    ratio = (G[:, :, None] - G[:, None, :]).masked_fill(~anc_self, float("-inf")).exp()
    o = G.exp()[:, :, None] * (qe @ initial_state.to(acc)) + (ratio * (qe @ ke.transpose(1, 2))) @ U
    return o.transpose(0, 1).to(v.dtype)


@batched(3, 3, 2, 2, 1, 3, 0)
def gdn_tree_commit_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
    leaf: int | torch.Tensor,
) -> torch.Tensor:
    """State after the accepted path node 0..leaf, by replaying the delta rule along that path only.

    Args: as gdn_tree_verify_ref; leaf: accepted leaf node index (0 when every draft was rejected: the state still
    advances by the root token). Returns: [HV, K, V].
    """
    path = torch.tensor(path_to(parents, int(leaf)), dtype=torch.long, device=k.device)
    q_dummy = k[path]
    _, state = gdn_recurrent_ref(q_dummy, k[path], v[path], g[path], beta[path], initial_state)
    return state


@batched(3, 3, 3, 2, 2, 1, 3)
def gdn_tree_verify_per_branch_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-branch recurrent baseline: one full state per node, computed from its parent's state.

    Returns: o [N, HV, V] and states [N, HV, K, V] (the N x HV x K x V memory the fused solve avoids).
    """
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    hv = v.shape[1]
    qe, ke = _expand_heads(q, hv).to(acc), _expand_heads(k, hv).to(acc)
    alpha, b, vv = g.to(acc).exp(), beta.to(acc), v.to(acc)
    s0 = initial_state.to(acc)
    states = torch.empty(q.shape[0], *initial_state.shape, dtype=acc, device=q.device)
    for i, p in enumerate(parents.tolist()):
        s = (s0 if p < 0 else states[p]) * alpha[i][:, None, None]
        u = b[i][:, None] * (vv[i] - torch.einsum("hkv,hk->hv", s, ke[i]))
        states[i] = s + ke[i][:, :, None] * u[:, None, :]
    o = torch.einsum("nhkv,nhk->nhv", states, qe)
    return o.to(v.dtype), states.to(initial_state.dtype)


@batched(2, 2, 1, 1, 2)
def gdn_tree_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    parents: torch.Tensor,
    conv_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Tree-aware causal depthwise conv: each node convolves over its own ancestor path.

    Args:
        x: [N, C] conv inputs of the tree nodes. weight: [C, W] (weight[:, W-1] multiplies the node itself).
        bias: [C] or None. parents: [N]. conv_state: [C, W-1] the last W-1 committed inputs (oldest first), which
        fill the window above node 0. activation: "silu" or None.
    Returns:
        y: [N, C].
    """
    w = weight.shape[1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    plist = parents.tolist()
    y = torch.empty(x.shape, dtype=acc, device=x.device)
    for i in range(x.shape[0]):
        window = [x[i]]
        node = plist[i]
        while len(window) < w and node >= 0:
            window.append(x[node])
            node = plist[node]
        missing = w - len(window)
        cols = torch.stack(window[::-1], dim=1).to(acc)  # [C, len]
        if missing:
            cols = torch.cat([conv_state[:, conv_state.shape[1] - missing :].to(acc), cols], dim=1)
        y[i] = (cols * weight.to(acc)).sum(1) + (0 if bias is None else bias.to(acc))
    if activation == "silu":
        y = torch.nn.functional.silu(y)
    elif activation is not None:
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    return y.to(x.dtype)


@batched(2, 1, 2, 0)
def gdn_tree_conv_commit_ref(
    x: torch.Tensor, parents: torch.Tensor, conv_state: torch.Tensor, leaf: int | torch.Tensor
) -> torch.Tensor:
    """Conv window after accepting node 0..leaf: the last W-1 inputs of conv_state ++ x[path]. Returns [C, W-1]."""
    path = path_to(parents, int(leaf))
    full = torch.cat([conv_state, x[path].transpose(0, 1).to(conv_state.dtype)], dim=1)
    return full[:, full.shape[1] - conv_state.shape[1] :].clone()
