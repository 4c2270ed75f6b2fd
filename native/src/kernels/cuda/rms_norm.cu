// Row normalizations, fp32 (x may alias out):
//   rms_norm:        y = x * rsqrt(mean(x^2) + eps) * (offset ? 1 + w : w)
//   rms_norm_gated:  y = x * rsqrt(mean(x^2) + eps) * w * silu(z)   (GDN output norm, fused gate)
//   l2_norm:         y = x / sqrt(sum(x^2) + eps) * scale          (GDN q/k, fused q scale)
//   add_rms_norm:    x += r; y = rms_norm(x)  (residual add fused with the next norm: one launch
//                    instead of two; same sums in the same order, so the bits of add + rms_norm)
// Rows of dim <= 1024 (per-head norms) get one warp each, 8 rows per block; longer rows (the
// hidden size) one block of 256 threads each. Two passes over the row: the second hits L1.
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

enum class Kind { kRms, kRmsOffset, kGated, kL2 };

// Sum of squares of row r over this thread's group (a warp or the block).
template <bool kWarpRow>
__device__ __forceinline__ float row_sumsq(const float* xr, int64_t dim, int idx, int n_thr,
                                           float* red) {
  float s = 0.0f;
  for (int64_t j = idx; j < dim; j += n_thr) s = fmaf(xr[j], xr[j], s);
  return kWarpRow ? warp_sum(s) : block_sum(s, red);
}

template <Kind K, bool kWarpRow>
__global__ void norm_kernel(const float* x, const float* z, const float* w, int64_t n_rows,
                            int64_t dim, float eps, float scale, float* out) {
  __shared__ float red[32];
  const int64_t r = kWarpRow ? static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)
                             : blockIdx.x;
  if (r >= n_rows) return;  // whole warps (warp rows) or whole blocks leave together
  const int idx = kWarpRow ? (threadIdx.x & 31) : threadIdx.x;
  const int n_thr = kWarpRow ? 32 : blockDim.x;
  const float* xr = x + r * dim;
  float* yr = out + r * dim;
  const float ss = row_sumsq<kWarpRow>(xr, dim, idx, n_thr, red);
  const float inv = K == Kind::kL2 ? scale / sqrtf(ss + eps)
                                   : 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t j = idx; j < dim; j += n_thr) {
    float y = xr[j] * inv;
    if (K == Kind::kRms) y *= w[j];
    if (K == Kind::kRmsOffset) y *= 1.0f + w[j];
    if (K == Kind::kGated) y = y * w[j] * silu_f(z[r * dim + j]);
    yr[j] = y;
  }
}

// Rows up to this many values per thread stay in registers (256 threads: hidden sizes to 8192).
constexpr int kAddNormRegs = 32;

// x += r row by row, then the rms norm of the new row (each thread re-reads only what it wrote).
template <bool kOffset, bool kWarpRow>
__global__ void add_norm_kernel(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps,
                                float* out) {
  __shared__ float red[32];
  const int64_t row = kWarpRow ? static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)
                               : blockIdx.x;
  if (row >= n_rows) return;
  const int idx = kWarpRow ? (threadIdx.x & 31) : threadIdx.x;
  const int n_thr = kWarpRow ? 32 : blockDim.x;
  float* xr = x + row * dim;
  const float* rr = r + row * dim;
  float* yr = out + row * dim;
  float s = 0.0f;
  if (dim <= static_cast<int64_t>(n_thr) * kAddNormRegs) {
    // The row in registers: every load is issued before any store (x and r may alias as far as
    // the compiler knows). Same sums in the same order as below. Measured (H200, ncu, batch-1
    // decode of the 27B shape): 17.9 us per call, the loop below 18.3: the store-before-load chain
    // was not what makes this 20 KB row slow; a shared-memory row with a short loop measured the
    // same decode step (14.36 vs 14.37 ms). Cause still open (see tools/gpu/NOTES.md).
    float v[kAddNormRegs];
#pragma unroll
    for (int i = 0; i < kAddNormRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      v[i] = j < dim ? xr[j] + rr[j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kAddNormRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      if (j < dim) {
        xr[j] = v[i];
        s = fmaf(v[i], v[i], s);
      }
    }
    const float ss = kWarpRow ? warp_sum(s) : block_sum(s, red);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
#pragma unroll
    for (int i = 0; i < kAddNormRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      if (j < dim) yr[j] = v[i] * inv * (kOffset ? 1.0f + w[j] : w[j]);
    }
    return;
  }
  for (int64_t j = idx; j < dim; j += n_thr) {
    const float v = xr[j] + rr[j];
    xr[j] = v;
    s = fmaf(v, v, s);
  }
  const float ss = kWarpRow ? warp_sum(s) : block_sum(s, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t j = idx; j < dim; j += n_thr) {
    float y = xr[j] * inv;
    y *= kOffset ? 1.0f + w[j] : w[j];
    yr[j] = y;
  }
}

template <bool kOffset>
void launch_add_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps, float* out,
                     cudaStream_t stream) {
  if (dim <= 1024) {
    add_norm_kernel<kOffset, true><<<grid_1d(n_rows, 8), 256, 0, stream>>>(x, r, w, n_rows, dim, eps, out);
  } else {
    if (n_rows > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda add_rms_norm: too many rows");
    add_norm_kernel<kOffset, false><<<static_cast<unsigned>(n_rows), 256, 0, stream>>>(x, r, w, n_rows, dim, eps,
                                                                                       out);
  }
  PE_CUDA_LAUNCH_CHECK();
}

template <Kind K>
void launch(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim, float eps,
            float scale, float* out, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  if (dim <= 1024) {
    norm_kernel<K, true><<<grid_1d(n_rows, 8), 256, 0, stream>>>(x, z, w, n_rows, dim, eps, scale,
                                                                 out);
  } else {
    if (n_rows > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda norm: too many rows");
    norm_kernel<K, false><<<static_cast<unsigned>(n_rows), 256, 0, stream>>>(x, z, w, n_rows, dim,
                                                                            eps, scale, out);
  }
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
              float* out, cudaStream_t stream) {
  if (offset) launch<Kind::kRmsOffset>(x, nullptr, w, n_rows, dim, eps, 1.0f, out, stream);
  else launch<Kind::kRms>(x, nullptr, w, n_rows, dim, eps, 1.0f, out, stream);
}

void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim,
                    float eps, float* out, cudaStream_t stream) {
  launch<Kind::kGated>(x, z, w, n_rows, dim, eps, 1.0f, out, stream);
}

void add_rms_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
                  float* out, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  if (offset) launch_add_norm<true>(x, r, w, n_rows, dim, eps, out, stream);
  else launch_add_norm<false>(x, r, w, n_rows, dim, eps, out, stream);
}

void l2_norm(float* x, int64_t n_rows, int64_t dim, float eps, float scale, cudaStream_t stream) {
  launch<Kind::kL2>(x, nullptr, nullptr, n_rows, dim, eps, scale, x, stream);
}

}  // namespace cuda
}  // namespace pe
