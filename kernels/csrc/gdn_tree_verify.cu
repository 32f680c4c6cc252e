// Rollback-free GDN tree verify (METHOD.md section 7) as a torch extension.
//
// One thread block per (sequence, value head); thread t owns value column t. Node by node in topological order, the
// block forward substitution of the masked solve is run along each node's ancestor chain (the ancestor mask, walked
// through parents):
//   u_i = beta_i (v_i - e^G_i k_i.S0) - sum_(j proper ancestor) beta_i e^(G_i - G_j) (k_i.k_j) u_j
//   o_i = e^G_i q_i.S0 + sum_(j ancestor-or-self) e^(G_i - G_j) (q_i.k_j) u_j
// Each thread reads back only its own column of U, so no block-wide barrier is needed after writing it.
#include <torch/extension.h>

namespace {

constexpr int kMaxNodes = 1024;

template <typename scalar_t>
__global__ void gdn_tree_verify_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                                       const scalar_t* __restrict__ v, const scalar_t* __restrict__ g,
                                       const scalar_t* __restrict__ beta, const int64_t* __restrict__ parents,
                                       const scalar_t* __restrict__ h0, float* __restrict__ u, scalar_t* __restrict__ o,
                                       int N, int H, int HV, int K, int V) {
  __shared__ float G[kMaxNodes];
  const int b = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / (HV / H), t = threadIdx.x;
  const int64_t* par = parents + (int64_t)b * N;
  if (t == 0) {  // path prefix G_i = g_i + G_parent(i): parents come first in topological order
    for (int i = 0; i < N; ++i) {
      const float gi = static_cast<float>(g[((int64_t)b * N + i) * HV + hv]);
      G[i] = par[i] < 0 ? gi : gi + G[par[i]];
    }
  }
  __syncthreads();
  if (t >= V) return;
  const scalar_t* s0 = h0 + ((int64_t)b * HV + hv) * K * V;
  float* ub = u + ((int64_t)b * HV + hv) * N * V;
  for (int i = 0; i < N; ++i) {
    const scalar_t* ki = k + (((int64_t)b * N + i) * H + h) * K;
    const scalar_t* qi = q + (((int64_t)b * N + i) * H + h) * K;
    float ks0 = 0.f, qs0 = 0.f;
    for (int d = 0; d < K; ++d) {
      const float s = static_cast<float>(s0[(int64_t)d * V + t]);
      ks0 += static_cast<float>(ki[d]) * s;
      qs0 += static_cast<float>(qi[d]) * s;
    }
    const float bi = static_cast<float>(beta[((int64_t)b * N + i) * HV + hv]);
    const float eG = expf(G[i]);
    float ui = bi * (static_cast<float>(v[(((int64_t)b * N + i) * HV + hv) * V + t]) - eG * ks0);
    float oi = eG * qs0;
    for (int64_t j = par[i]; j >= 0; j = par[j]) {  // proper ancestors: ratios e^(G_i - G_j) <= 1
      const scalar_t* kj = k + (((int64_t)b * N + j) * H + h) * K;
      float kk = 0.f, qk = 0.f;
      for (int d = 0; d < K; ++d) {
        kk += static_cast<float>(ki[d]) * static_cast<float>(kj[d]);
        qk += static_cast<float>(qi[d]) * static_cast<float>(kj[d]);
      }
      const float r = expf(G[i] - G[j]), uj = ub[j * V + t];
      ui -= bi * r * kk * uj;
      oi += r * qk * uj;
    }
    float qk_self = 0.f;
    for (int d = 0; d < K; ++d) qk_self += static_cast<float>(qi[d]) * static_cast<float>(ki[d]);
    ub[(int64_t)i * V + t] = ui;
    o[(((int64_t)b * N + i) * HV + hv) * V + t] = static_cast<scalar_t>(oi + qk_self * ui);
  }
}

}  // namespace

// q, k [B, N, H, K]; v [B, N, HV, V]; g, beta [B, N, HV]; parents [B, N] int64; initial_state [B, HV, K, V]
// -> o [B, N, HV, V]. All inputs on one CUDA device, contiguous, same floating dtype (parents int64).
torch::Tensor gdn_tree_verify(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor g, torch::Tensor beta,
                              torch::Tensor parents, torch::Tensor initial_state) {
  TORCH_CHECK(q.is_cuda(), "gdn_tree_verify: CUDA tensors expected");
  TORCH_CHECK(parents.scalar_type() == torch::kInt64, "gdn_tree_verify: parents must be int64");
  const int B = k.size(0), N = k.size(1), H = k.size(2), K = k.size(3), HV = v.size(2), V = v.size(3);
  TORCH_CHECK(N <= kMaxNodes, "gdn_tree_verify: at most ", kMaxNodes, " nodes, got ", N);
  TORCH_CHECK(V <= 1024, "gdn_tree_verify: value dim must be <= 1024, got ", V);
  TORCH_CHECK(HV % H == 0, "gdn_tree_verify: value heads ", HV, " must be a multiple of key heads ", H);
  auto o = torch::empty({B, N, HV, V}, v.options());
  auto u = torch::empty({B, HV, N, V}, v.options().dtype(torch::kFloat32));
  const int threads = ((V + 31) / 32) * 32;
  AT_DISPATCH_FLOATING_TYPES_AND2(torch::kHalf, torch::kBFloat16, v.scalar_type(), "gdn_tree_verify", [&] {
    gdn_tree_verify_kernel<scalar_t><<<B * HV, threads>>>(
        q.contiguous().data_ptr<scalar_t>(), k.contiguous().data_ptr<scalar_t>(), v.contiguous().data_ptr<scalar_t>(),
        g.contiguous().data_ptr<scalar_t>(), beta.contiguous().data_ptr<scalar_t>(),
        parents.contiguous().data_ptr<int64_t>(), initial_state.contiguous().data_ptr<scalar_t>(),
        u.data_ptr<float>(), o.data_ptr<scalar_t>(), N, H, HV, K, V);
  });
  return o;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gdn_tree_verify", &gdn_tree_verify, "Rollback-free GDN tree verify (masked solve along ancestor chains)");
}
