// linear for prefill-sized batches (n > 8 tokens): out[n, rows] = x[n, cols] * W^T on the fp16
// tensor cores, fp32 accumulation.
//
// Block tile BM tokens x 128 weight rows x 32 k, 8 warps (2 x 4), warp tile BM/2 x 32; BM = 128
// from 128 tokens (the weight tile is converted once per 128 tokens), else 64. Each k tile
// is loaded from global memory into registers one step ahead (no cp.async on sm_75) and kept raw
// while the current tile's products run (nothing waits on those loads until the store), converted to
// fp16 (x clamped to +-65504; BF16 -> fp16 exact in the normal range; FP8 * block scale, I8 * row
// scale, NVFP4 * group * global scale rounded to fp16) and stored into a double-buffered shared
// tile (rows padded to 40 halves: ldmatrix without bank conflicts). Fragments come from ldmatrix; the product is mma.sync m16n8k16 on
// sm_80+ and two m16n8k8 on sm_75 (same fragments). Weights are never materialized in fp16 beyond
// one 128 x 32 tile. Shapes with cols % 8 != 0 or unaligned pointers use scalar guarded loads.
// This is the kernel of every GPU by default; linear_gemm_set_variant(1) sends the cases that
// linear_gemm_sm80.cu takes (sm_80+, vector path) there instead.
#include <algorithm>

#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace {

constexpr int BN = 128, BK = 32, LDS = BK + 8, kThreads = 256;
int64_t g_big_tile_tokens = 128;  // n >= this: 128-token tiles (weights converted half as often)
int g_variant = 0;                 // linear_gemm_set_variant (cuda_ops.h)

// Raw bits of 8 weights at (row, k) .. (row, k+7); VEC: aligned and in bounds (row < rows).
// srow: the FP8 block-scale row of `row` (block_scale + (row / block) * column blocks), kblk:
// k / block, both computed by the caller once per row / k tile (64-bit divisions per load cost
// more than the loads).
template <DType DT, bool VEC>
__device__ __forceinline__ GemmRaw load_w(const WeightView& w, int64_t row, int64_t k, const float* srow,
                                          uint32_t kblk) {
  GemmRaw r;
  r.s = 1.0f;
  if constexpr (VEC) {
    if (row >= w.rows || k >= w.cols) {  // cols % 8 == 0: a group is all in or all out
      r.a = r.b = make_uint4(0, 0, 0, 0);
      return r;
    }
    const int64_t i = row * w.cols + k;
    if constexpr (DT == DType::F32) {
      r.a = *reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + i);
      r.b = *reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + i + 4);
    } else if constexpr (DT == DType::I8) {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(w.data) + i);
      r.a = make_uint4(v.x, v.y, 0, 0);
      r.s = w.row_scale[row];
    } else if constexpr (DT == DType::NVFP4) {  // 8 e2m1 values = 4 bytes, one 16-value group
      r.a = make_uint4(static_cast<const uint32_t*>(w.data)[i >> 3], 0, 0, 0);
      r.s = e4m3_to_f32(w.group_scale[i >> 4]) * w.global_scale;
    } else if constexpr (DT == DType::FP8_E4M3) {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) + i);
      r.a = make_uint4(v.x, v.y, 0, 0);
      r.s = srow[kblk] * 256.0f;
    } else {
      r.a = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w.data) + i);
    }
  } else {  // decoded to fp32 here (scale applied), treated as F32 by convert_w
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = (row < w.rows && k + e < w.cols) ? weight_elem(w, row, k + e) : 0.0f;
    r.a = *reinterpret_cast<const uint4*>(f);
    r.b = *reinterpret_cast<const uint4*>(f + 4);
  }
  return r;
}

template <bool VEC>
__device__ __forceinline__ void load_x(const float* x, int64_t n, int64_t cols, int64_t t, int64_t k,
                                       float4& lo, float4& hi) {
  lo = hi = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (VEC) {
    if (t < n && k < cols) {
      lo = *reinterpret_cast<const float4*>(x + t * cols + k);
      hi = *reinterpret_cast<const float4*>(x + t * cols + k + 4);
    }
  } else {
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = (t < n && k + e < cols) ? x[t * cols + k + e] : 0.0f;
    lo = make_float4(f[0], f[1], f[2], f[3]);
    hi = make_float4(f[4], f[5], f[6], f[7]);
  }
}

template <DType DT, bool VEC, int BM>
__global__ void __launch_bounds__(kThreads)
    gemm_kernel(const float* __restrict__ x, int64_t n, WeightView w, float* __restrict__ out, int num_n,
                int group_m) {
  __shared__ __align__(16) __half As[2][BM][LDS];
  __shared__ __align__(16) __half Bs[2][BN][LDS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  // Tile order (L2 reuse): groups of group_m token tiles sweep every weight tile, the token tiles
  // of a group side by side, so a group's x rows stay in L2 while the weights stream once per group
  // (instead of x re-read from HBM for every weight tile and W for every token tile).
  const int num_m = static_cast<int>((n + BM - 1) / BM);
  const int per_group = group_m * num_n, gid = static_cast<int>(blockIdx.x) / per_group;
  const int first_m = gid * group_m, gsize = min(num_m - first_m, group_m);
  const int in_group = static_cast<int>(blockIdx.x) - gid * per_group;
  const int64_t m0 = static_cast<int64_t>(first_m + in_group % gsize) * BM;
  const int64_t n0 = static_cast<int64_t>(in_group / gsize) * BN;
  const int64_t cols = w.cols;
  const int lr = tid >> 2, lk = (tid & 3) * 8;  // this thread's load row and k offset
  const int n_k = static_cast<int>((cols + BK - 1) / BK);

  constexpr int MI = BM / 32, XC = BM / 64;  // m16 tiles per warp; x chunks per thread
  float acc[MI][4][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  float4 xa_lo[XC], xa_hi[XC];
  GemmRaw wr[2];
  // FP8 block-scale rows of this thread's two weight rows (clamped rows load zeros anyway).
  const float* srow[2] = {nullptr, nullptr};
  if constexpr (VEC && DT == DType::FP8_E4M3) {
    const int64_t ncb = (cols + w.block - 1) / w.block;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      srow[i] = w.block_scale + (min(n0 + lr + 64 * i, w.rows - 1) / w.block) * ncb;
  }
  const uint32_t block = static_cast<uint32_t>(DT == DType::FP8_E4M3 ? w.block : 1);
  auto load = [&](int kt) {
    const int64_t k = static_cast<int64_t>(kt) * BK + lk;
#pragma unroll
    for (int j = 0; j < XC; ++j) load_x<VEC>(x, n, cols, m0 + lr + 64 * j, k, xa_lo[j], xa_hi[j]);
    const uint32_t kblk = static_cast<uint32_t>(k) / block;
#pragma unroll
    for (int i = 0; i < 2; ++i) wr[i] = load_w<DT, VEC>(w, n0 + lr + 64 * i, k, srow[i], kblk);
  };
  auto store = [&](int buf) {
#pragma unroll
    for (int j = 0; j < XC; ++j) {
      const float f[8] = {xa_lo[j].x, xa_lo[j].y, xa_lo[j].z, xa_lo[j].w,
                          xa_hi[j].x, xa_hi[j].y, xa_hi[j].z, xa_hi[j].w};
      *reinterpret_cast<uint4*>(&As[buf][lr + 64 * j][lk]) = floats_to_half8(f);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<uint4*>(&Bs[buf][lr + 64 * i][lk]) = convert_w<DT, VEC>(wr[i]);
  };

  load(0);
  store(0);
  __syncthreads();
  for (int kt = 0; kt < n_k; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_k) load(kt + 1);
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      uint32_t af[MI][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
        ldmatrix_x4(af[mi], &As[buf][warp_m * (BM / 2) + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, &Bs[buf][warp_n * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)]
                          [ks + ((lane >> 3) & 1) * 8]);
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);  // linear_common.cuh
    }
    if (kt + 1 < n_k) store(buf ^ 1);
    __syncthreads();
  }
  // Epilogue: c0,c1 at (row g, cols 2t, 2t+1), c2,c3 at row g + 8 (tokens x weight rows).
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t t = m0 + warp_m * (BM / 2) + mi * 16 + (lane >> 2) + (e >> 1) * 8;
        const int64_t r = n0 + warp_n * 32 + ni * 8 + (lane & 3) * 2 + (e & 1);
        if (t < n && r < w.rows) out[t * w.rows + r] = acc[mi][ni][e];
      }
}

template <DType DT, int BM>
void launch_tiles(bool vec, const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  const int64_t num_n = grid_1d(w.rows, BN), num_m = grid_1d(n, BM);
  if (num_n * num_m > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::linear: too many tiles");
  // ~16 MB of x rows per group (fp32): well inside the H200's 50 MB L2; on a 2080 Ti (5.5 MB) a
  // group still shares its rows between the tiles resident at once.
  const int64_t group_m = std::clamp<int64_t>((int64_t(16) << 20) / (int64_t(BM) * w.cols * 4), 1, num_m);
  const unsigned grid = static_cast<unsigned>(num_n * num_m);
  const int nn = static_cast<int>(num_n), gm = static_cast<int>(group_m);
  if (vec) gemm_kernel<DT, true, BM><<<grid, kThreads, 0, s>>>(x, n, w, out, nn, gm);
  else gemm_kernel<DT, false, BM><<<grid, kThreads, 0, s>>>(x, n, w, out, nn, gm);
}

template <DType DT>
void launch(bool vec, const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  constexpr bool kBigTiles = DT == DType::FP8_E4M3 || DT == DType::NVFP4;  // measured, cuda_ops.h
  if constexpr (kBigTiles) {
    if (n >= g_big_tile_tokens) return launch_tiles<DT, 128>(vec, x, n, w, out, s);
  }
  launch_tiles<DT, 64>(vec, x, n, w, out, s);
}

}  // namespace

// linear_gemm_sm80.cu: false where it does not run (then this file's kernel does).
bool linear_gemm_sm80(const float* x, int64_t n, const WeightView& w, int64_t big_tile_tokens, float* out,
                      cudaStream_t stream);

void linear_gemm_set_big_tile_tokens(int64_t n) { g_big_tile_tokens = n; }
void linear_gemm_set_variant(int variant) { g_variant = variant; }

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t stream) {
  auto al = [](const void* p, int a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; };
  bool vec = w.cols % 8 == 0 && al(x, 16);
  if (w.dtype == DType::FP8_E4M3) vec = vec && al(w.data, 8) && w.block % 8 == 0;
  else if (w.dtype == DType::I8) vec = vec && al(w.data, 8);
  else if (w.dtype == DType::NVFP4) vec = vec && al(w.data, 4);
  else vec = vec && al(w.data, 16);
  if (g_variant == 1 && vec && linear_gemm_sm80(x, n, w, g_big_tile_tokens, out, stream)) return;
  switch (w.dtype) {
    case DType::F32: launch<DType::F32>(vec, x, n, w, out, stream); break;
    case DType::F16: launch<DType::F16>(vec, x, n, w, out, stream); break;
    case DType::BF16: launch<DType::BF16>(vec, x, n, w, out, stream); break;
    case DType::I8: launch<DType::I8>(vec, x, n, w, out, stream); break;
    case DType::NVFP4: launch<DType::NVFP4>(vec, x, n, w, out, stream); break;
    default: launch<DType::FP8_E4M3>(vec, x, n, w, out, stream); break;
  }
  PE_CUDA_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace pe
