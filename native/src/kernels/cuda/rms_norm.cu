// Row normalizations, fp32 (x may alias out):
//   rms_norm:        y = x * rsqrt(mean(x^2) + eps) * (offset ? 1 + w : w)
//   rms_norm_gated:  y = x * rsqrt(mean(x^2) + eps) * w * silu(z)   (GDN output norm, fused gate;
//                    z may be strided: a token's heads contiguous, tokens z_stride apart)
//   l2_norm:         y = x / sqrt(sum(x^2) + eps) * scale          (GDN q/k, fused q scale)
//   add_rms_norm:    x += r; y = rms_norm(x)  (residual add fused with the next norm: one launch
//                    instead of two; same sums in the same order, so the bits of add + rms_norm)
// Rows of dim <= 1024 (per-head norms) get one warp each, 8 rows per block; longer rows (the
// hidden size) one block each: 1024 threads to 8192 values, else 256.
//
// These kernels are latency bound (a decode row is 20 KB), so each thread loads its whole share
// of the row (x, r, w, z) into registers before its first store or use: one memory round trip
// per row instead of one per value. A store may alias a later load as far as the compiler knows
// (out may be x), so a load-use-store loop runs its loads one round trip at a time (about twice
// the time of the row in registers: tools/gpu/KERNELS.md, "Norms"); the 27B decode step has 128
// of them. Rows longer than kRowRegs
// values per thread take the two-pass loop. Each thread sums its values in the same order on both
// paths (j = idx, idx + n_thr, ...), so both give the same bits.
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {
namespace {

enum class Kind { kRms, kRmsOffset, kGated, kL2 };

// Values per lane kept in registers by warp rows (to 1024 values).
constexpr int kRowRegs = 32;
// Warp rows of at most 8 values per lane (head dims to 256) unroll only that far.
constexpr int kShortRowRegs = 8;
// Block rows to 8192 values (the hidden size): 1024 threads of 8 values each, not 256 of 20: a
// row norm sits on the step's critical path between two GEMVs, and fewer serial loads per thread
// shorten it.
constexpr int kWideThreads = 1024;

template <Kind K>
__device__ __forceinline__ float norm_scale(float ss, int64_t dim, float eps, float scale) {
  return K == Kind::kL2 ? scale / sqrtf(ss + eps) : 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
}

template <Kind K>
__device__ __forceinline__ float norm_out(float x, float inv, float w, float z) {
  float y = x * inv;
  if (K == Kind::kRms) y *= w;
  if (K == Kind::kRmsOffset) y *= 1.0f + w;
  if (K == Kind::kGated) y = y * w * silu_f(z);
  return y;
}

// kRegs > 0: the row in registers (dim <= n_thr * kRegs); kRegs == 0: two passes over the row.
template <Kind K, bool kWarpRow, int kRegs>
__global__ void norm_kernel(const float* x, const float* z, const float* w, int64_t n_rows,
                            int64_t dim, float eps, float scale, float* out, int64_t z_heads, int64_t z_stride) {
  pdl_wait();  // launched as a programmatic dependent (launch_pdl)
  pdl_trigger();  // the next GEMV may start prefetching its weights
  __shared__ float red[32];
  const int64_t r = kWarpRow ? static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)
                             : blockIdx.x;
  if (r >= n_rows) return;  // whole warps (warp rows) or whole blocks leave together
  const int idx = kWarpRow ? (threadIdx.x & 31) : threadIdx.x;
  const int n_thr = kWarpRow ? 32 : blockDim.x;
  const float* xr = x + r * dim;
  const float* zr = K == Kind::kGated ? z + (r / z_heads) * z_stride + (r % z_heads) * dim : nullptr;
  float* yr = out + r * dim;
  float s = 0.0f;
  if constexpr (kRegs > 0) {
    float v[kRegs], wv[kRegs], zv[kRegs];
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      const bool in = j < dim;
      v[i] = in ? xr[j] : 0.0f;
      wv[i] = (K != Kind::kL2 && in) ? w[j] : 0.0f;
      zv[i] = (K == Kind::kGated && in) ? zr[j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kRegs; ++i) s = fmaf(v[i], v[i], s);  // padding adds 0: same bits
    const float inv = norm_scale<K>(kWarpRow ? warp_sum(s) : block_sum(s, red), dim, eps, scale);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      if (j < dim) yr[j] = norm_out<K>(v[i], inv, wv[i], zv[i]);
    }
  } else {
    for (int64_t j = idx; j < dim; j += n_thr) s = fmaf(xr[j], xr[j], s);
    const float inv = norm_scale<K>(kWarpRow ? warp_sum(s) : block_sum(s, red), dim, eps, scale);
    for (int64_t j = idx; j < dim; j += n_thr)
      yr[j] = norm_out<K>(xr[j], inv, K == Kind::kL2 ? 0.0f : w[j], K == Kind::kGated ? zr[j] : 0.0f);
  }
}

// x += r row by row, then the rms norm of the new row (each thread re-reads only what it wrote).
template <bool kOffset, bool kWarpRow, int kRegs>
__global__ void add_norm_kernel(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps,
                                float* out) {
  pdl_wait();
  pdl_trigger();
  __shared__ float red[32];
  const int64_t row = kWarpRow ? static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)
                               : blockIdx.x;
  if (row >= n_rows) return;
  const int idx = kWarpRow ? (threadIdx.x & 31) : threadIdx.x;
  const int n_thr = kWarpRow ? 32 : blockDim.x;
  float* xr = x + row * dim;
  const float* rr = r + row * dim;
  float* yr = out + row * dim;
  constexpr Kind K = kOffset ? Kind::kRmsOffset : Kind::kRms;
  float s = 0.0f;
  if constexpr (kRegs > 0) {
    float v[kRegs], wv[kRegs];
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      const bool in = j < dim;
      v[i] = in ? xr[j] + rr[j] : 0.0f;
      wv[i] = in ? w[j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      if (j < dim) xr[j] = v[i];
      s = fmaf(v[i], v[i], s);
    }
    const float inv = norm_scale<K>(kWarpRow ? warp_sum(s) : block_sum(s, red), dim, eps, 1.0f);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int64_t j = idx + static_cast<int64_t>(i) * n_thr;
      if (j < dim) yr[j] = norm_out<K>(v[i], inv, wv[i], 0.0f);
    }
  } else {
    for (int64_t j = idx; j < dim; j += n_thr) {
      const float v = xr[j] + rr[j];
      xr[j] = v;
      s = fmaf(v, v, s);
    }
    const float inv = norm_scale<K>(kWarpRow ? warp_sum(s) : block_sum(s, red), dim, eps, 1.0f);
    for (int64_t j = idx; j < dim; j += n_thr) yr[j] = norm_out<K>(xr[j], inv, w[j], 0.0f);
  }
}

// Grid and template choice shared by both kernels: F<kWarpRow, kRegs>(grid, threads).
template <typename Launch>
void launch_rows(int64_t n_rows, int64_t dim, const char* what, Launch&& launch) {
  constexpr int kThreads = 256;
  if (dim <= 32 * kShortRowRegs) {
    launch(std::integral_constant<bool, true>{}, std::integral_constant<int, kShortRowRegs>{}, grid_1d(n_rows, 8), kThreads);
  } else if (dim <= 32 * kRowRegs) {
    launch(std::integral_constant<bool, true>{}, std::integral_constant<int, kRowRegs>{}, grid_1d(n_rows, 8), kThreads);
  } else {
    if (n_rows > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda ", what, ": too many rows");
    const unsigned grid = static_cast<unsigned>(n_rows);
    if (dim <= kWideThreads * kShortRowRegs)
      launch(std::integral_constant<bool, false>{}, std::integral_constant<int, kShortRowRegs>{}, grid, kWideThreads);
    else
      launch(std::integral_constant<bool, false>{}, std::integral_constant<int, 0>{}, grid, kThreads);
  }
  PE_CUDA_LAUNCH_CHECK();
}

template <bool kOffset>
void launch_add_norm(float* x, const float* r, const float* w, int64_t n_rows, int64_t dim, float eps, float* out,
                     cudaStream_t stream) {
  launch_rows(n_rows, dim, "add_rms_norm", [&](auto warp_row, auto regs, auto grid, int threads) {
    launch_pdl(add_norm_kernel<kOffset, decltype(warp_row)::value, decltype(regs)::value>, dim3(grid), dim3(threads), 0,
               stream, x, r, w, n_rows, dim, eps, out);
  });
}

template <Kind K>
void launch(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim, float eps,
            float scale, float* out, cudaStream_t stream, int64_t z_heads = 1, int64_t z_stride = 0) {
  if (n_rows <= 0 || dim <= 0) return;
  if (z_heads <= 0) z_heads = 1;
  if (z_stride == 0) z_stride = z_heads * dim;
  launch_rows(n_rows, dim, "norm", [&](auto warp_row, auto regs, auto grid, int threads) {
    launch_pdl(norm_kernel<K, decltype(warp_row)::value, decltype(regs)::value>, dim3(grid), dim3(threads), 0, stream,
               x, z, w, n_rows, dim, eps, scale, out, z_heads, z_stride);
  });
}

}  // namespace
void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, bool offset,
              float* out, cudaStream_t stream) {
  if (offset) launch<Kind::kRmsOffset>(x, nullptr, w, n_rows, dim, eps, 1.0f, out, stream);
  else launch<Kind::kRms>(x, nullptr, w, n_rows, dim, eps, 1.0f, out, stream);
}

void rms_norm_gated(const float* x, const float* z, const float* w, int64_t n_rows, int64_t dim,
                    float eps, float* out, cudaStream_t stream, int64_t z_heads, int64_t z_stride) {
  launch<Kind::kGated>(x, z, w, n_rows, dim, eps, 1.0f, out, stream, z_heads, z_stride);
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
