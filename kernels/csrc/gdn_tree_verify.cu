// Rollback-free GDN tree verify (METHOD.md section 7) as a torch extension.
//
// One thread block per (sequence, value head, 128 value columns), launched on the stream the caller passes (the
// Python wrapper passes torch's current stream, so the op is CUDA-graph capturable; only c10 headers that a CPU build
// of torch ships are used, so the source compiles wherever nvcc exists). Three phases separated by block barriers:
//   1. path prefix G_i = sum of g over the ancestors-or-self of i (each thread walks the parent chains of its nodes);
//   2. the masked Gram entries along ancestor chains only, one warp per node, K split over the lanes (coalesced loads,
//      shuffle reduction): A_ij = beta_i e^(G_i - G_j) k_i.k_j for proper ancestors j, QK_ij = e^(G_i - G_j) q_i.k_j
//      for ancestors-or-self (ratios e^(G_i - G_j) <= 1); written to a per-head [N, N] scratch, no recurrent state;
//   3. block forward substitution in topological order, thread t < 128 owning value column 128 * blockIdx.y + t and
//      that column of S0 in registers, k_i and q_i staged in shared memory (the next node's loaded during the current
//      one's solve):
//        u_i = beta_i (v_i - e^G_i k_i.S0) - sum_(j proper ancestor) A_ij u_j
//        o_i = e^G_i q_i.S0 + sum_(j ancestor-or-self) QK_ij u_j
//      Each thread reads back only its own column of U.
#include <torch/extension.h>

namespace {

constexpr int kMaxNodes = 1024;
constexpr int kWarp = 32;
constexpr int kThreads = 256;  // phases 1-2 use them all; phase 3 the first kColumns
constexpr int kColumns = 128;  // value columns per block (grid.y splits V)

template <typename scalar_t, int KT>
__global__ void __launch_bounds__(kThreads)
    gdn_tree_verify_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                           const scalar_t* __restrict__ v, const scalar_t* __restrict__ g,
                           const scalar_t* __restrict__ beta, const int64_t* __restrict__ parents,
                           const scalar_t* __restrict__ h0, float* __restrict__ akk, float* __restrict__ aqk,
                           float* __restrict__ u, scalar_t* __restrict__ o, int N, int H, int HV, int K, int V) {
  __shared__ int par[kMaxNodes];
  __shared__ float G[kMaxNodes];
  __shared__ float ks[KT], qs[KT];
  const int b = blockIdx.x / HV, hv = blockIdx.x % HV, h = hv / (HV / H), t = threadIdx.x;
  const int lane = t % kWarp, warp = t / kWarp, warps = blockDim.x / kWarp, c = blockIdx.y * kColumns + t;
  const int64_t head = (int64_t)b * HV + hv;
  float* A = akk + head * N * N;
  float* QK = aqk + head * N * N;
  float* ub = u + head * N * V;

  // phase 1: parents and path prefix sums of the log-decays
  for (int i = t; i < N; i += blockDim.x) par[i] = static_cast<int>(parents[(int64_t)b * N + i]);
  __syncthreads();
  for (int i = t; i < N; i += blockDim.x) {
    float s = 0.f;
    for (int j = i; j >= 0; j = par[j]) s += static_cast<float>(g[((int64_t)b * N + j) * HV + hv]);
    G[i] = s;
  }
  __syncthreads();

  // phase 2: Gram entries along each node's ancestor chain, a warp per node
  for (int i = warp; i < N; i += warps) {
    const scalar_t* ki = k + (((int64_t)b * N + i) * H + h) * K;
    const scalar_t* qi = q + (((int64_t)b * N + i) * H + h) * K;
    const float bi = static_cast<float>(beta[((int64_t)b * N + i) * HV + hv]);
    for (int j = i; j >= 0; j = par[j]) {
      const scalar_t* kj = k + (((int64_t)b * N + j) * H + h) * K;
      float kk = 0.f, qk = 0.f;
      for (int d = lane; d < K; d += kWarp) {
        const float x = static_cast<float>(kj[d]);
        kk += static_cast<float>(ki[d]) * x;
        qk += static_cast<float>(qi[d]) * x;
      }
      for (int m = kWarp / 2; m > 0; m /= 2) {
        kk += __shfl_xor_sync(0xffffffffu, kk, m);
        qk += __shfl_xor_sync(0xffffffffu, qk, m);
      }
      if (lane == 0) {
        const float r = expf(G[i] - G[j]);
        A[(int64_t)i * N + j] = j == i ? 0.f : bi * r * kk;
        QK[(int64_t)i * N + j] = r * qk;
      }
    }
  }
  __syncthreads();

  // phase 3: forward substitution along the topological order, one value column per thread; node i + 1's k, q, v and
  // beta are loaded while node i is solved, and the ancestor chain is read four links at a time (independent loads)
  const bool owner = t < kColumns && c < V;
  float s0[KT];
#pragma unroll
  for (int d = 0; d < KT; ++d) s0[d] = owner && d < K ? static_cast<float>(h0[(head * K + d) * V + c]) : 0.f;
  float k_next = 0.f, q_next = 0.f, v_next = 0.f, b_next = 0.f;
  auto prefetch = [&](int i) {
    const int64_t row = ((int64_t)b * N + i) * H + h, x = ((int64_t)b * N + i) * HV + hv;
    k_next = t < K ? static_cast<float>(k[row * K + t]) : 0.f;  // t < kThreads = max KT
    q_next = t < K ? static_cast<float>(q[row * K + t]) : 0.f;
    v_next = owner ? static_cast<float>(v[x * V + c]) : 0.f;
    b_next = owner ? static_cast<float>(beta[x]) : 0.f;
  };
  prefetch(0);
  for (int i = 0; i < N; ++i) {
    if (t < KT) {
      ks[t] = k_next;
      qs[t] = q_next;
    }
    const float vi = v_next, bi = b_next;
    __syncthreads();
    if (i + 1 < N) prefetch(i + 1);
    if (owner) {
      float ks0 = 0.f, qs0 = 0.f;
#pragma unroll
      for (int d = 0; d < KT; ++d) {
        ks0 += ks[d] * s0[d];
        qs0 += qs[d] * s0[d];
      }
      const float eG = expf(G[i]);
      const float* Ai = A + (int64_t)i * N;
      const float* QKi = QK + (int64_t)i * N;
      float ui = bi * (vi - eG * ks0), oi = eG * qs0;
      for (int j0 = par[i]; j0 >= 0;) {
        const int j1 = par[j0];
        const int j2 = j1 >= 0 ? par[j1] : -1;
        const int j3 = j2 >= 0 ? par[j2] : -1;
        const int js[4] = {j0, j1, j2, j3};
        float a[4], qk[4], uj[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const bool live = js[m] >= 0;
          a[m] = live ? Ai[js[m]] : 0.f;
          qk[m] = live ? QKi[js[m]] : 0.f;
          uj[m] = live ? ub[(int64_t)js[m] * V + c] : 0.f;
        }
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          ui -= a[m] * uj[m];
          oi += qk[m] * uj[m];
        }
        j0 = j3 >= 0 ? par[j3] : -1;
      }
      ub[(int64_t)i * V + c] = ui;
      o[((int64_t)b * N + i) * HV * V + (int64_t)hv * V + c] = static_cast<scalar_t>(oi + QKi[i] * ui);
    }
    __syncthreads();  // ks / qs are overwritten by the next node
  }
}

template <typename scalar_t, int KT>
void launch(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& g,
            const torch::Tensor& beta, const torch::Tensor& parents, const torch::Tensor& h0, torch::Tensor& akk,
            torch::Tensor& aqk, torch::Tensor& u, torch::Tensor& o, cudaStream_t stream) {
  const int B = k.size(0), N = k.size(1), H = k.size(2), K = k.size(3), HV = v.size(2), V = v.size(3);
  const dim3 grid(B * HV, (V + kColumns - 1) / kColumns);
  gdn_tree_verify_kernel<scalar_t, KT><<<grid, kThreads, 0, stream>>>(
      q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), g.data_ptr<scalar_t>(),
      beta.data_ptr<scalar_t>(), parents.data_ptr<int64_t>(), h0.data_ptr<scalar_t>(), akk.data_ptr<float>(),
      aqk.data_ptr<float>(), u.data_ptr<float>(), o.data_ptr<scalar_t>(), N, H, HV, K, V);
  const cudaError_t error = cudaGetLastError();
  TORCH_CHECK(error == cudaSuccess, "gdn_tree_verify: kernel launch failed: ", cudaGetErrorString(error));
}

}  // namespace

// q, k [B, N, H, K]; v [B, N, HV, V]; g, beta [B, N, HV]; parents [B, N] int64; initial_state [B, HV, K, V]
// -> o [B, N, HV, V]. All inputs on the CUDA device that is current, same floating dtype (parents int64);
// N <= 1024, K <= 256; stream: the cudaStream_t (as an integer) to launch on, torch.cuda.current_stream().cuda_stream.
torch::Tensor gdn_tree_verify(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor g, torch::Tensor beta,
                              torch::Tensor parents, torch::Tensor initial_state, int64_t stream) {
  TORCH_CHECK(q.is_cuda(), "gdn_tree_verify: CUDA tensors expected");
  TORCH_CHECK(parents.scalar_type() == torch::kInt64, "gdn_tree_verify: parents must be int64");
  const int B = k.size(0), N = k.size(1), H = k.size(2), K = k.size(3), HV = v.size(2), V = v.size(3);
  TORCH_CHECK(N <= kMaxNodes, "gdn_tree_verify: at most ", kMaxNodes, " nodes, got ", N);
  TORCH_CHECK(K <= 256, "gdn_tree_verify: key dim must be <= 256, got ", K);
  TORCH_CHECK(HV % H == 0, "gdn_tree_verify: value heads ", HV, " must be a multiple of key heads ", H);
  auto f32 = v.options().dtype(torch::kFloat32);
  auto o = torch::empty({B, N, HV, V}, v.options());
  auto u = torch::empty({B, HV, N, V}, f32);
  auto akk = torch::empty({B, HV, N, N}, f32);
  auto aqk = torch::empty({B, HV, N, N}, f32);
  auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), gc = g.contiguous(), bc = beta.contiguous();
  auto pc = parents.contiguous(), hc = initial_state.contiguous();
  const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);
  auto run = [&](auto zero) {  // the register tile KT: K rounded up to 32, 64, 128 or 256
    using scalar_t = decltype(zero);
    if (K <= 32) {
      launch<scalar_t, 32>(qc, kc, vc, gc, bc, pc, hc, akk, aqk, u, o, cuda_stream);
    } else if (K <= 64) {
      launch<scalar_t, 64>(qc, kc, vc, gc, bc, pc, hc, akk, aqk, u, o, cuda_stream);
    } else if (K <= 128) {
      launch<scalar_t, 128>(qc, kc, vc, gc, bc, pc, hc, akk, aqk, u, o, cuda_stream);
    } else {
      launch<scalar_t, 256>(qc, kc, vc, gc, bc, pc, hc, akk, aqk, u, o, cuda_stream);
    }
  };
  switch (v.scalar_type()) {
    case torch::kFloat:
      run(float{});
      break;
    case torch::kHalf:
      run(at::Half{});
      break;
    case torch::kBFloat16:
      run(at::BFloat16{});
      break;
    default:
      TORCH_CHECK(false, "gdn_tree_verify: float32, float16 or bfloat16 expected, got ", v.scalar_type());
  }
  return o;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gdn_tree_verify", &gdn_tree_verify, "Rollback-free GDN tree verify (masked solve along ancestor chains)");
}
