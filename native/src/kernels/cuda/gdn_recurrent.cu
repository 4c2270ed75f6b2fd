// Gated delta rule, token by token (decode; any n): per value head h (key head h / (Hv / Hk)),
// state S_h [dk, dv] fp32, per token: S = e^g S; delta = beta (v - S^T k); S += k delta^T;
// o = S^T q.
// Every column j of S evolves independently (it needs only k, q and v[j]), so blocks split the
// columns: block (h, 32 columns), 128 threads, 4 threads per column, each holding rows
// p, p + 4, ... of its column in registers (DK / 4 of them); the two column sums per token are
// 2-step shuffles inside the 4 threads. k and q of the token are staged in shared memory.
// The state is read once and written once per call, however many tokens.
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kCols = 32, kThreads = 128;

template <int DK>
__global__ void __launch_bounds__(kThreads) gdn_recurrent_kernel(GdnArgs a) {
  constexpr int NR = DK / 4;
  __shared__ float ks[DK], qs[DK];
  const int h = blockIdx.x;
  const int kh = static_cast<int>(h / (a.Hv / a.Hk));
  const int dk = static_cast<int>(a.dk), dv = static_cast<int>(a.dv);
  const int p = threadIdx.x & 3;
  const int j = blockIdx.y * kCols + (threadIdx.x >> 2);
  const bool col_ok = j < dv;
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  float s[NR];
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    const int i = p + 4 * m;
    s[m] = (col_ok && i < dk) ? S[static_cast<int64_t>(i) * dv + j] : 0.0f;
  }
  for (int64_t t = 0; t < a.n; ++t) {
    __syncthreads();  // previous token's reads of ks/qs are done
    for (int i = threadIdx.x; i < DK; i += kThreads) {
      ks[i] = i < dk ? a.k[t * a.qk_stride + static_cast<int64_t>(kh) * dk + i] : 0.0f;
      qs[i] = i < dk ? a.q[t * a.qk_stride + static_cast<int64_t>(kh) * dk + i] : 0.0f;
    }
    __syncthreads();
    const float decay = expf(a.g[t * a.Hv + h]);
    const float beta = a.beta[t * a.Hv + h];
    const float vj = col_ok ? a.v[t * a.v_stride + static_cast<int64_t>(h) * dv + j] : 0.0f;
    float kv = 0.0f;
#pragma unroll
    for (int m = 0; m < NR; ++m) {
      s[m] *= decay;
      kv = fmaf(s[m], ks[p + 4 * m], kv);
    }
    kv += __shfl_xor_sync(0xffffffffu, kv, 1);
    kv += __shfl_xor_sync(0xffffffffu, kv, 2);
    const float delta = beta * (vj - kv);
    float o = 0.0f;
#pragma unroll
    for (int m = 0; m < NR; ++m) {
      s[m] = fmaf(ks[p + 4 * m], delta, s[m]);
      o = fmaf(s[m], qs[p + 4 * m], o);
    }
    o += __shfl_xor_sync(0xffffffffu, o, 1);
    o += __shfl_xor_sync(0xffffffffu, o, 2);
    if (col_ok && p == 0) a.out[(t * a.Hv + h) * dv + j] = o;
  }
#pragma unroll
  for (int m = 0; m < NR; ++m) {
    const int i = p + 4 * m;
    if (col_ok && i < dk) S[static_cast<int64_t>(i) * dv + j] = s[m];
  }
}

}  // namespace

void gdn_recurrent(const GdnArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.Hk <= 0 || a.Hv % a.Hk != 0)
    fail(PE_ERR_INVALID_ARGUMENT, "cuda::gdn_recurrent: Hv must be a multiple of Hk");
  if (a.dk <= 0 || a.dk > 256 || a.dv <= 0)
    fail(PE_ERR_UNSUPPORTED, "cuda::gdn_recurrent: dk must be 1..256");
  const dim3 grid(static_cast<unsigned>(a.Hv), grid_1d(a.dv, kCols));
  if (a.dk <= 32) gdn_recurrent_kernel<32><<<grid, kThreads, 0, stream>>>(a);
  else if (a.dk <= 64) gdn_recurrent_kernel<64><<<grid, kThreads, 0, stream>>>(a);
  else if (a.dk <= 128) gdn_recurrent_kernel<128><<<grid, kThreads, 0, stream>>>(a);
  else gdn_recurrent_kernel<256><<<grid, kThreads, 0, stream>>>(a);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
