// linear for decode-sized batches (n <= 8 tokens; 16-bit and fp32 weights up to 64 tokens where the
// work is small): out[n, rows] = x[n, cols] * W^T, and the dispatcher pe::cuda::linear (GEMV here
// or in linear_gemv_q.cu; quantized weights at 9..32 tokens in linear_gemv_q_wide.cu; GEMM in
// linear_gemm.cu).
//
// F32 / F16 / BF16 weights (this file): memory bound, every weight byte is read once, so the
// kernel streams W with 16-byte loads (4 fp32 / 8 fp16|bf16 per lane), R = 4 rows per warp (4
// independent loads in flight per lane, unrolled twice), each x group reused by the R rows. Math
// is fp32 (weights widened in registers by shifts: cheaper than any conversion instruction), so
// the result matches the CPU to fp32 rounding. x (n * cols * 4 bytes) stays in L1/L2.
// Tokens are padded to NT in {1, 2, 4, 8}; padded tokens re-read token n-1 and are not written.
// More than 8 tokens (a speculative verify: 8 sequences x (1 + k) rows) run in groups of 8, one
// block per (row block, token group), the group index fastest: a row block's groups start
// together and read its weights from L2 after the first. Only where rows x cols x n is at most
// kWideMaxFma (a small model's matrices): there the tiled GEMM's ~20 us a launch on 2 .. 8 tiles
// (the default model's batch-8 verify on an H100: 30 a step, 0.59 of its 1.46 ms) is latency,
// while a large matrix's fp32 FMAs would outlast the GEMM's weight read.
// Short matrices (few row quads) split the columns over up to 8 warps, summed in shared memory.
// FP8 / I8 / NVFP4 weights take the tensor-core GEMV (linear_gemv_q.cu: the decode, not the
// bytes, limits a SIMT kernel there). Shapes whose rows are not 16-byte aligned take a scalar
// warp-per-row kernel (every format).
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream,
                 const GemmWorkspace* workspace);
bool gemv_q_supported(const float* x, const WeightView& w);
bool gemv_q_swiglu_supported(const float* x, const WeightView& w, int64_t up0, int64_t inter);
int linear_gemv_q(const float* x, int64_t n, const WeightView& w, const GemvEpilogue& ep, float* out,
                  cudaStream_t stream);
void linear_gemv_q_wide(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream);

namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;  // weight rows per warp
constexpr int64_t kWideMaxTokens = 64;
constexpr int64_t kWideMaxFma = int64_t(1) << 28;  // ~8 us of fp32 FMAs on an H100

template <DType DT> struct Elems { static constexpr int G = 8; };
template <> struct Elems<DType::F32> { static constexpr int G = 4; };

// Widens one 16-byte group of weights into G floats.
template <DType DT>
__device__ __forceinline__ void widen(const uint4& v, float* f) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  if constexpr (DT == DType::F32) {
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = __uint_as_float(u[e]);
  } else if constexpr (DT == DType::F16) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&u[e]));
      f[2 * e] = p.x;
      f[2 * e + 1] = p.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[2 * e] = __uint_as_float(u[e] << 16);
      f[2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
    }
  }
}

template <DType DT, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const float* __restrict__ x, int n, WeightView w, int ks, int groups, float* __restrict__ out) {
  constexpr int G = Elems<DT>::G;
  // Block (row block, token group NT wide), the group fastest.
  const int group = static_cast<int>(blockIdx.x % groups);
  const int64_t block = blockIdx.x / groups;
  x += static_cast<int64_t>(group) * NT * w.cols;
  out += static_cast<int64_t>(group) * NT * w.rows;
  n = min(n - group * NT, NT);
  constexpr int ES = 16 / G;  // bytes per element
  __shared__ float red[kWarps][kRows][NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slice = warp % ks;  // this warp's share of the columns (ks warps per row quad)
  const int64_t row0 = (block * (kWarps / ks) + warp / ks) * kRows;
  const int64_t cols = w.cols, n_groups = row0 < w.rows ? cols / G : 0;
  const char* rowp[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = min(row0 + r, w.rows - 1);  // clamped rows are computed, not written
    rowp[r] = static_cast<const char*>(w.data) + row * cols * ES;
  }
  const float* xt[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) xt[t] = x + static_cast<int64_t>(min(t, n - 1)) * cols;
  float acc[kRows][NT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;

#pragma unroll 2
  for (int64_t g = lane + 32 * slice; g < n_groups; g += 32 * ks) {
    uint4 raw[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) raw[r] = load_stream(rowp[r] + g * 16);
    float wf[kRows][G];
#pragma unroll
    for (int r = 0; r < kRows; ++r) widen<DT>(raw[r], wf[r]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float xv[G];
#pragma unroll
      for (int e = 0; e < G; e += 4) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(xt[t] + g * G + e));
        xv[e] = v.x; xv[e + 1] = v.y; xv[e + 2] = v.z; xv[e + 3] = v.w;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float p = 0.0f;
#pragma unroll
        for (int e = 0; e < G; ++e) p = fmaf(wf[r][e], xv[e], p);
        acc[r][t] += p;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]);
  if (ks > 1) {  // sum the column slices of the row quad
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) red[warp][r][t] = acc[r][t];
    __syncthreads();
    if (slice != 0) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        for (int s = 1; s < ks; ++s) acc[r][t] += red[warp + s][r][t];
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (row0 + r < w.rows && t < n) out[static_cast<int64_t>(t) * w.rows + row0 + r] = acc[r][t];
  }
}

// Any shape and alignment: one warp per row, scalar loads.
__global__ void gemv_scalar_kernel(const float* __restrict__ x, int n, WeightView w,
                                   float* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= w.rows) return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = lane; j < w.cols; j += 32) {
    const float wv = weight_elem(w, row, j);
#pragma unroll
    for (int t = 0; t < 8; ++t)
      if (t < n) acc[t] = fmaf(wv, x[t * w.cols + j], acc[t]);
  }
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < n) out[t * w.rows + row] = s;
  }
}

template <DType DT>
void launch_gemv(const float* x, int n, const WeightView& w, float* out, cudaStream_t stream) {
  // Short matrices split the columns over up to 8 warps per row quad so that ~2000 warps
  // (16 per SM of a 132-SM GPU) stream the weight.
  const int64_t quads = (w.rows + kRows - 1) / kRows;
  int ks = 1;
  while (ks < kWarps && quads * ks < 2048 && (w.cols / Elems<DT>::G) >= 64 * ks) ks *= 2;
  const int groups = (n + 7) / 8;  // token groups of 8 (n > 8)
  const unsigned blocks = grid_1d(quads, kWarps / ks) * static_cast<unsigned>(groups);
  const int threads = kWarps * 32;
  if (n == 1) gemv_kernel<DT, 1><<<blocks, threads, 0, stream>>>(x, n, w, ks, 1, out);
  else if (n == 2) gemv_kernel<DT, 2><<<blocks, threads, 0, stream>>>(x, n, w, ks, 1, out);
  else if (n <= 4) gemv_kernel<DT, 4><<<blocks, threads, 0, stream>>>(x, n, w, ks, 1, out);
  else gemv_kernel<DT, 8><<<blocks, threads, 0, stream>>>(x, n, w, ks, groups, out);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The consumer's half of a split norm in the GEMV's epilogue (GemvEpilogue::norm_*).
GemvEpilogue norm_epilogue(const float* x, int64_t n, const WeightView& w, const SplitNorm* norm, const char* op) {
  GemvEpilogue ep;
  if (!norm) return ep;
  if (!linear_split_norm_supported(x, n, w) || norm->parts <= 0 || norm->dim <= 0 || !norm->partial)
    fail(PE_ERR_UNSUPPORTED, op, ": a split norm's input for ", dtype_name(w.dtype), " ", w.rows, "x", w.cols, ", ",
         n, " tokens, ", norm->parts, " partials (linear_split_norm_supported, linear_add_norm)");
  ep.norm_partial = norm->partial;
  ep.norm_parts = norm->parts;
  ep.norm_dim = static_cast<float>(norm->dim);
  ep.norm_eps = norm->eps;
  return ep;
}

}  // namespace

void linear(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream, const SplitNorm* norm,
            const GemmWorkspace* workspace) {
  check_weight(w, "cuda::linear");
  if (n <= 0 || w.rows <= 0) return;
  if (norm) {
    linear_gemv_q(x, n, w, norm_epilogue(x, n, w, norm, "cuda::linear"), out, stream);
    PE_CUDA_LAUNCH_CHECK();
    return;
  }
  if (w.cols <= 0) {
    PE_CUDA_CHECK(cudaMemsetAsync(out, 0, n * w.rows * sizeof(float), stream));
    return;
  }
  const bool vector16 = !quantized_weight(w) && w.cols % (w.dtype == DType::F32 ? 4 : 8) == 0 && aligned16(w.data) &&
                        aligned16(x);
  if (n > 8) {  // 9 .. linear_gemv_max_tokens(): the quantized GEMV where it takes the weight
    if (n <= linear_gemv_max_tokens() && quantized_weight(w) && gemv_q_supported(x, w)) {
      linear_gemv_q_wide(x, n, w, out, stream);
      PE_CUDA_LAUNCH_CHECK();
      return;
    }
    // 16-bit / fp32 weights: token groups of the GEMV where the work is small (header).
    if (!(vector16 && n <= kWideMaxTokens && w.rows * w.cols * n <= kWideMaxFma))
      return linear_gemm(x, n, w, out, stream, workspace);
  }
  const int nn = static_cast<int>(n);
  if (quantized_weight(w) && gemv_q_supported(x, w)) {
    linear_gemv_q(x, n, w, GemvEpilogue{}, out, stream);
  } else if (vector16) {
    switch (w.dtype) {
      case DType::F32: launch_gemv<DType::F32>(x, nn, w, out, stream); break;
      case DType::F16: launch_gemv<DType::F16>(x, nn, w, out, stream); break;
      default: launch_gemv<DType::BF16>(x, nn, w, out, stream); break;
    }
  } else {
    gemv_scalar_kernel<<<grid_1d(w.rows, kWarps), kWarps * 32, 0, stream>>>(x, nn, w, out);
  }
  PE_CUDA_LAUNCH_CHECK();
}

bool linear_swiglu_supported(const float* x, int64_t n, const WeightView& w, int64_t up0, int64_t inter) {
  return n >= 1 && n <= 8 && gemv_q_swiglu_supported(x, w, up0, inter);
}

void linear_swiglu(const float* x, int64_t n, const WeightView& w, int64_t up0, int64_t inter, float* out,
                   cudaStream_t stream, const SplitNorm* norm) {
  check_weight(w, "cuda::linear_swiglu");
  if (!linear_swiglu_supported(x, n, w, up0, inter))
    fail(PE_ERR_UNSUPPORTED, "cuda::linear_swiglu: not for ", dtype_name(w.dtype), " ", w.rows, "x", w.cols,
         " (tile ", w.tile, ") with up rows at ", up0, ", ", inter, " outputs, ", n, " tokens");
  GemvEpilogue ep = norm_epilogue(x, n, w, norm, "cuda::linear_swiglu");
  ep.up0 = up0;
  ep.inter = inter;
  linear_gemv_q(x, n, w, ep, out, stream);
  PE_CUDA_LAUNCH_CHECK();
}

int64_t split_norm_partial_floats(int64_t dim) { return (dim + 7) / 8; }  // row blocks of >= 8 rows

bool linear_split_norm_supported(const float* x, int64_t n, const WeightView& w) {
  return n >= 1 && n <= 8 && w.rows > 0 && w.cols > 0 && quantized_weight(w) && gemv_q_supported(x, w);
}

void linear_add_norm(const float* in, int64_t n, const WeightView& w, SplitNorm& norm, cudaStream_t stream) {
  check_weight(w, "cuda::linear_add_norm");
  if (!linear_split_norm_supported(in, n, w) || w.rows != norm.dim || !norm.x || !norm.h || !norm.w || !norm.partial)
    fail(PE_ERR_UNSUPPORTED, "cuda::linear_add_norm: not for ", dtype_name(w.dtype), " ", w.rows, "x", w.cols, ", ", n,
         " tokens, dim ", norm.dim, " (linear_split_norm_supported; x, h, w and partial set)");
  GemvEpilogue ep;
  ep.res_x = norm.x;
  ep.res_h = norm.h;
  ep.res_w = norm.w;
  ep.res_offset = norm.offset;
  ep.res_partial = norm.partial;
  norm.parts = linear_gemv_q(in, n, w, ep, nullptr, stream);
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
