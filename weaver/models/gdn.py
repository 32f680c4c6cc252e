"""Gated DeltaNet token mixer (Qwen3-Next / Qwen3.5 linear-attention layers), chain and tree forms (METHOD.md 7).

Per token: a causal depthwise conv (width W = 4) + SiLU over concat(q, k, v); q, k L2-normalised, q scaled by K^-1/2;
g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); the delta rule
    S <- e^g S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q
with HV value heads sharing H key heads (GQA); output out_proj(RMSNorm(o) * silu(z)).

A chain of T > 1 new tokens (prefill, training) runs in chunks: per chunk one triangular solve (the tree solve on a
chain) gives the outputs and the state in closed form, batched over B and heads. One new token takes the recurrent
step in place on the cached state. A verify writes no recurrent state: it stashes (k, v, g, beta) and the conv
inputs of its nodes for commit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from weaver_kernels import gdn_tree_commit, gdn_tree_conv1d, gdn_tree_conv_commit_ref, gdn_tree_verify

from weaver.models.cache import GDNCache, Pass
from weaver.models.config import ModelConfig
from weaver.models.layers import GatedRMSNorm, Linear

CHAIN_CHUNK = 64  # tokens per triangular solve when a chain of new tokens (prefill) is run in chunks


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last dim, in fp32 (the convention of the Qwen3-Next reference)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_k = config.linear_num_key_heads
        self.n_v = config.linear_num_value_heads
        self.dk = config.linear_key_head_dim
        self.dv = config.linear_value_head_dim
        if self.n_k <= 0 or self.n_v % self.n_k:
            raise ValueError(
                f"linear_num_value_heads ({self.n_v}) must be a multiple of linear_num_key_heads ({self.n_k})"
            )
        self.width = config.linear_conv_kernel_dim
        dim = config.hidden_size
        self.conv_dim = 2 * self.n_k * self.dk + self.n_v * self.dv
        self.in_proj_qkv = Linear(dim, self.conv_dim, bias=False)
        self.in_proj_z = Linear(dim, self.n_v * self.dv, bias=False)
        self.in_proj_b = nn.Linear(dim, self.n_v, bias=False)
        self.in_proj_a = nn.Linear(dim, self.n_v, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.width, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v))
        a_log = torch.empty(self.n_v)
        if not a_log.is_meta:  # the loaders build under torch.device("meta"), where these ops would import ~1 s
            a_log.uniform_(0.01, 16).log_()
        self.A_log = nn.Parameter(a_log)
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = Linear(self.n_v * self.dv, dim, bias=False)

    def new_cache(self, batch_size: int, max_tree_nodes: int, dtype: torch.dtype, device: torch.device) -> GDNCache:
        b, n = batch_size, max_tree_nodes

        def zeros(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dt, device=device)

        return GDNCache(
            conv=zeros(b, self.conv_dim, self.width - 1),
            state=zeros(b, self.n_v, self.dk, self.dv, dt=torch.float32),
            k=zeros(b, n, self.n_k, self.dk, dt=torch.float32),
            v=zeros(b, n, self.n_v, self.dv),
            g=zeros(b, n, self.n_v, dt=torch.float32),
            beta=zeros(b, n, self.n_v),
            x=zeros(b, n, self.conv_dim),
        )

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: GDNCache | None, p: Pass
    ) -> torch.Tensor:
        """x [B, T, d] -> [B, T, d]; `rope` is unused (GDN has no positions). A tree pass (p.parents) needs B = 1."""
        b, t, _ = x.shape
        mixed = self.in_proj_qkv(x)  # [B, T, C] conv inputs
        if p.parents is not None:
            o = self._tree(mixed[0], x[0], cache, p.parents)[None]
        else:
            o = self._chain(mixed, x, cache)
        z = self.in_proj_z(x).view(b, t, self.n_v, self.dv)
        return self.out_proj(self.norm(o, z).reshape(b, t, -1))

    def _qkv_gates(self, conv_out: torch.Tensor, x: torch.Tensor):
        """conv_out [..., C], x [..., d] -> q, k [..., H, K] (q scaled), v [..., HV, V], g, beta [..., HV]."""
        lead = conv_out.shape[:-1]
        q, k, v = conv_out.split([self.n_k * self.dk, self.n_k * self.dk, self.n_v * self.dv], dim=-1)
        q = _l2norm(q.reshape(*lead, self.n_k, self.dk)) * self.dk**-0.5
        k = _l2norm(k.reshape(*lead, self.n_k, self.dk))
        v = v.reshape(*lead, self.n_v, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        return q, k, v, g, beta

    def _chain(self, mixed: torch.Tensor, x: torch.Tensor, cache: GDNCache | None) -> torch.Tensor:
        """T new tokens after the cached state (zeros without a cache) -> o [B, T, HV, V]; advances the cache."""
        b, t, _ = mixed.shape
        conv_state = cache.conv if cache is not None else mixed.new_zeros(b, self.conv_dim, self.width - 1)
        window = torch.cat([conv_state, mixed.transpose(1, 2)], dim=2)  # [B, C, W - 1 + T]
        conv_out = F.silu(F.conv1d(window, self.conv1d.weight, groups=self.conv_dim)).transpose(1, 2)
        q, k, v, g, beta = self._qkv_gates(conv_out, x)
        if cache is None:
            state = torch.zeros(b, self.n_v, self.dk, self.dv, dtype=torch.float32, device=x.device)
            return _chain_delta_rule(q, k, v, g, beta, state)[0].to(x.dtype)
        cache.conv.copy_(window[:, :, t:])
        if t == 1:
            return _recurrent_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], cache.state)[:, None].to(x.dtype)
        o, state = _chain_delta_rule(q, k, v, g, beta, cache.state)
        cache.state.copy_(state)
        return o.to(x.dtype)

    def _tree(self, mixed: torch.Tensor, x: torch.Tensor, cache: GDNCache, parents: torch.Tensor) -> torch.Tensor:
        """Tree verify for one sequence: mixed [N, C], x [N, d] -> o [N, HV, V]; stashes the nodes, no state write."""
        n = mixed.shape[0]
        conv_out = gdn_tree_conv1d(mixed, self.conv1d.weight[:, 0], None, parents, cache.conv[0], "silu")
        q, k, v, g, beta = self._qkv_gates(conv_out, x)
        for stash, value in ((cache.k, k), (cache.v, v), (cache.g, g), (cache.beta, beta), (cache.x, mixed)):
            stash[0, :n] = value
        return gdn_tree_verify(q, k, v, g, beta, parents, cache.state[0])

    def commit(self, cache: GDNCache, parents: torch.Tensor, leaf: int) -> None:
        """Advance state and conv window along the path node 0..leaf of the last verify (replay or fold)."""
        n = parents.numel()
        s = slice(0, n)
        k, v, g, beta = cache.k[0, s], cache.v[0, s], cache.g[0, s], cache.beta[0, s]
        cache.state[0] = gdn_tree_commit(k, v, g, beta, parents, cache.state[0], leaf)
        cache.conv[0] = gdn_tree_conv_commit_ref(cache.x[0, s], parents, cache.conv[0], leaf)


def _recurrent_step(q, k, v, g, beta, state: torch.Tensor) -> torch.Tensor:
    """One token, in place on state [B, HV, K, V]: q, k [B, H, K], v [B, HV, V], g, beta [B, HV] -> o [B, HV, V]."""
    rep = state.shape[1] // q.shape[1]
    q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    state.mul_(g.exp()[..., None, None])
    u = beta.float()[..., None] * (v.float() - torch.einsum("bhkv,bhk->bhv", state, k))
    state.add_(k[..., :, None] * u[..., None, :])
    return torch.einsum("bhkv,bhk->bhv", state, q)


def _chain_delta_rule(q, k, v, g, beta, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain of T tokens in chunks of CHAIN_CHUNK -> (o [B, T, HV, V], final state [B, HV, K, V]), in fp32.

    q, k [B, T, H, K] (normalised, q scaled), v [B, T, HV, V], g, beta [B, T, HV], state [B, HV, K, V]. Per chunk,
    with G the chunk-local cumsum of g and S the state before the chunk (the tree solve of weaver_kernels' reference
    on a chain, batched, plus the state in closed form instead of a token-by-token replay):
        (I + A) U = beta (V - e^G K S),  A_ij = beta_i e^(G_i - G_j) k_i . k_j  (j < i)
        o = e^G Q S + (e^(G_i - G_j) q_i . k_j)_(j <= i) U,   S' = e^(G_last) S + (e^(G_last - G) K)^T U
    tests/test_models.py checks it (values and gradients) against the sequential gdn_recurrent_ref.
    """
    b, t, h, _ = q.shape
    hv = v.shape[2]
    rep = hv // h
    # [B, HV, T, .] in fp32, key heads repeated for their value heads (GQA)
    qe = q.float().repeat_interleave(rep, dim=2).transpose(1, 2)
    ke = k.float().repeat_interleave(rep, dim=2).transpose(1, 2)
    vv, gg, bb = v.float().transpose(1, 2), g.float().transpose(1, 2), beta.float().transpose(1, 2)
    state = state.float()
    outs = []
    for lo in range(0, t, CHAIN_CHUNK):
        s = slice(lo, lo + CHAIN_CHUNK)
        qc, kc, vc, bc = qe[:, :, s], ke[:, :, s], vv[:, :, s], bb[:, :, s]
        n = qc.shape[2]
        G = gg[:, :, s].cumsum(-1)  # [B, HV, n]
        eye = torch.eye(n, dtype=torch.bool, device=q.device)
        diff = G[..., :, None] - G[..., None, :]
        # e^(G_i - G_j) <= 1 for j <= i; the masked (j > i) entries go to -inf before exp so nothing overflows
        decay = diff.masked_fill(~torch.ones_like(eye).tril(), float("-inf")).exp()
        A = bc[..., :, None] * decay.masked_fill(eye, 0.0) * (kc @ kc.transpose(-1, -2))  # strictly lower
        rhs = bc[..., None] * (vc - G.exp()[..., None] * (kc @ state))
        U = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)  # [B, HV, n, V]
        outs.append(G.exp()[..., None] * (qc @ state) + (decay * (qc @ kc.transpose(-1, -2))) @ U)
        last = G[..., -1:]  # [B, HV, 1]
        state = last.exp()[..., None] * state + (kc * (last - G).exp()[..., None]).transpose(-1, -2) @ U
    return torch.cat(outs, dim=2).transpose(1, 2), state
