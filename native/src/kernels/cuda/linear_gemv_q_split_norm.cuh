// The split norm's two halves in the quantized GEMV (linear_gemv_q.cu; cuda_ops.h SplitNorm):
// the producer's residual add with its partial sums of x^2, and the consumer's 1 / rms from them.
// Both sum in a fixed order (no atomics): the same bits on every run.
#pragma once
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace gemv_q {

// Consumer, after pdl_wait: inv[token] = 1 / sqrt(sum of the token's partials / dim + eps), warp
// `token` for each of the n <= 8 tokens (lanes over the partials, then the warp's tree): the
// rms_norm kernel's formula. The partials [n, parts] from `src`: ep.norm_partial, or the block's
// shared copy (split_norm_load). Read by the epilogue after its first __syncthreads.
__device__ __forceinline__ void split_norm_inv(const GemvEpilogue& ep, int n, const float* src, float* inv) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp >= n) return;
  const float* p = src + static_cast<int64_t>(warp) * ep.norm_parts;
  float s = 0.0f;
  for (int i = lane; i < ep.norm_parts; i += 32) s += p[i];
  s = warp_sum(s);
  if (lane == 0) inv[warp] = 1.0f / sqrtf(s / ep.norm_dim + ep.norm_eps);
}

// Where the n * parts partials are at most one per thread (split_norm_early): thread i loads
// partial i right after pdl_wait, so its round trip overlaps x's (a warp summing them first
// delayed its x staging or its first step by one); the caller puts the value in shared memory once
// it has waited for x, or after its first row block's steps, and sums from there.
__device__ __forceinline__ bool split_norm_early(const GemvEpilogue& ep, int n, int threads) {
  return ep.norm_partial && n * ep.norm_parts <= threads;
}
__device__ __forceinline__ float split_norm_load(const GemvEpilogue& ep, int n) {
  return threadIdx.x < n * ep.norm_parts ? ep.norm_partial[threadIdx.x] : 0.0f;
}

// The epilogue's store of output `row` of `token` (its sum s, weight scales applied): s times the
// consumer's 1 / rms where the input was a split norm's h; then out[token, row] = s, or for the
// producer x += s, h = x * weight. Returns the producer's new x^2 (else 0).
__device__ __forceinline__ float store_output(const GemvEpilogue& ep, const float* inv, int token, int64_t row,
                                              int64_t rows, float s, float* out) {
  if (ep.norm_partial) s *= inv[token];
  const int64_t i = static_cast<int64_t>(token) * rows + row;
  if (!ep.res_x) {
    out[i] = s;
    return 0.0f;
  }
  const float v = ep.res_x[i] + s;  // add_rms_norm's x + r
  ep.res_x[i] = v;
  ep.res_h[i] = v * (ep.res_offset ? 1.0f + ep.res_w[row] : ep.res_w[row]);
  return v * v;
}

// Producer, the whole block after the row block's stores: res_partial[token * parts + rb] = the sum
// of the row block's new x^2 of that token. Epilogue item idx = threadIdx.x (T * 64 <= the block's
// threads): token (idx >> 3) & 7, row group idx >> 6, so the 8-lane groups sum first, then thread
// `token` the T row groups in order. sq_rg: [T][8] shared floats; the caller syncs before reusing it.
template <int T>
__device__ __forceinline__ void add_norm_partial(const GemvEpilogue& ep, int n, int rb, int parts, float sq,
                                                 float (*sq_rg)[8]) {
  static_assert(T * 64 <= 256, "one epilogue item per thread");
  sq += __shfl_xor_sync(0xffffffffu, sq, 1);
  sq += __shfl_xor_sync(0xffffffffu, sq, 2);
  sq += __shfl_xor_sync(0xffffffffu, sq, 4);
  const int idx = threadIdx.x;
  if (idx < T * 64 && (idx & 7) == 0) sq_rg[idx >> 6][(idx >> 3) & 7] = sq;
  __syncthreads();
  if (idx < n) {
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < T; ++r) s += sq_rg[r][idx];
    ep.res_partial[static_cast<int64_t>(idx) * parts + rb] = s;
  }
}

}  // namespace gemv_q
}  // namespace cuda
}  // namespace pe
