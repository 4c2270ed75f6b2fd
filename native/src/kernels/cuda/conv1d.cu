// Causal depthwise conv1d + SiLU with a carried state (the GDN short convolution), fp32.
// x = [state (K-1 rows, oldest first); u (n rows, row stride u_stride)], w [C, K]:
//   out[t, c] = silu(sum_{j<K} w[c, j] x[t + j, c])      out [n, C] dense
//   state <- the last K-1 rows of x (raw inputs)
// Two launches: the outputs (one thread per (t, c), reads of the old state only), then the state
// shift (one thread per channel, rows in order so the in-place shift never overwrites a row it
// still needs). Same code for decode (n = 1) and prefill.
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kMaxK = 16;

__device__ __forceinline__ float x_at(const float* state, const float* u, int64_t u_stride,
                                      int64_t C, int S, int64_t r, int64_t c) {
  return r < S ? state[r * C + c] : u[(r - S) * u_stride + c];
}

__global__ void conv_out_kernel(const float* u, int64_t n, int64_t u_stride, int64_t C,
                                const float* w, int K, const float* state, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * C) return;
  const int64_t t = i / C, c = i % C;
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) acc = fmaf(w[c * K + j], x_at(state, u, u_stride, C, K - 1, t + j, c), acc);
  out[i] = silu_f(acc);
}

__global__ void conv_state_kernel(const float* u, int64_t n, int64_t u_stride, int64_t C, int K,
                                  float* state) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int S = K - 1;
  for (int r = 0; r < S; ++r) state[r * C + c] = x_at(state, u, u_stride, C, S, n + r, c);
}

}  // namespace

void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w,
                   int64_t K, float* state, float* out, cudaStream_t stream) {
  if (K < 1 || K > kMaxK) fail(PE_ERR_INVALID_ARGUMENT, "cuda::conv1d_causal: kernel width must be 1..16");
  if (n <= 0 || C <= 0) return;
  const int k = static_cast<int>(K);
  conv_out_kernel<<<grid_1d(n * C, 256), 256, 0, stream>>>(u, n, u_stride, C, w, k, state, out);
  PE_CUDA_LAUNCH_CHECK();
  if (K > 1) {
    conv_state_kernel<<<grid_1d(C, 256), 256, 0, stream>>>(u, n, u_stride, C, k, state);
    PE_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace cuda
}  // namespace pe
