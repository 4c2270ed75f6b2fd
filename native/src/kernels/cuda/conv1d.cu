// Causal depthwise conv1d + SiLU with a carried state (the GDN short convolution), fp32.
// u: n rows (row stride u_stride) at positions pos0 .. pos0 + n - 1; state: a ring [K, C] whose
// row p % K holds the raw input of position p; w [C, K] (math: kernels/cpu/conv1d.cpp):
//   x(p) = p >= pos0 ? u[p - pos0] : state[p mod K]
//   out[t, c] = silu(sum_{j<K} w[c, j] x(pos0 + t - (K-1) + j)[c])      out [n, C] dense
//   state[p % K] <- u[p - pos0] for the last min(n, K) positions (raw inputs)
// One launch, one thread per (t, c): only the first K-1 outputs of a channel read the ring, and
// the thread of (0, c) computes all of them before it writes that channel's new ring rows, so
// no thread reads a row another one writes (the threads of (1 .. K-2, c) have nothing to do).
// Same code for decode (n = 1) and prefill.
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int kMaxK = 16;

// Output t of channel c; x(pos0 + i) for i < 0 (i >= -(K-1)) is the ring row of that position.
__device__ __forceinline__ float conv_at(const float* u, int64_t u_stride, int64_t C, const float* w, int K,
                                         int64_t pos0, const float* state, int64_t t, int64_t c) {
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int64_t i = t - (K - 1) + j;
    const float x = i >= 0 ? u[i * u_stride + c] : state[(pos0 + i + K) % K * C + c];
    acc = fmaf(w[c * K + j], x, acc);
  }
  return silu_f(acc);
}

__global__ void conv_kernel(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int K,
                            int64_t pos0, float* state, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * C) return;
  const int64_t t = i / C, c = i % C;
  const int64_t head = n < K - 1 ? n : K - 1;  // outputs that read the ring
  if (t >= head) {
    out[i] = conv_at(u, u_stride, C, w, K, pos0, state, t, c);
  } else if (t == 0) {
    for (int64_t tt = 0; tt < head; ++tt) out[tt * C + c] = conv_at(u, u_stride, C, w, K, pos0, state, tt, c);
  }
  if (t != 0) return;
  for (int64_t r = n > K ? n - K : 0; r < n; ++r) state[(pos0 + r) % K * C + c] = u[r * u_stride + c];
}

}  // namespace

void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int64_t K,
                   int64_t pos0, float* state, float* out, cudaStream_t stream) {
  if (K < 1 || K > kMaxK) fail(PE_ERR_INVALID_ARGUMENT, "cuda::conv1d_causal: kernel width must be 1..16");
  if (pos0 < 0) fail(PE_ERR_INVALID_ARGUMENT, "cuda::conv1d_causal: negative position");
  if (n <= 0 || C <= 0) return;
  conv_kernel<<<grid_1d(n * C, 256), 256, 0, stream>>>(u, n, u_stride, C, w, static_cast<int>(K), pos0, state,
                                                         out);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
