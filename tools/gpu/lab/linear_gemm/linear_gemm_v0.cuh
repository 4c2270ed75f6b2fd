// v0 of the prefill GEMM (tools/gpu/lab/linear_gemm): the library's kernel before the 128 x 256
// tiles of linear_gemm.cuh, as measured against them (KERNELS.md "Prefill").
//
// Block tile BM tokens x 128 weight rows x 32 k, 8 warps (2 x 4), warp tile BM/2 x 32; BM = 128
// for FP8 / NVFP4 from 128 tokens, else 64. Each k tile is loaded into registers one step ahead,
// converted to fp16 (x clamped, weights scaled) and stored into a double-buffered shared tile
// (rows padded to 40 halves); ldmatrix fragments, mma.sync m16n8k16 (two m16n8k8 on sm_75). Every
// weight load computes its own 64-bit offset (tiled_offset), x is clamped by fmin / fmax.
// linear_gemm_v0.cu builds a library with this kernel in place of linear_gemm.cu (the "before" of
// an A/B on the engine).
#pragma once
#include <algorithm>

#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace gemm_v0 {

constexpr int BN = 128, BK = 32, LDS = BK + 8, kThreads = 256;

struct Raw {
  uint4 a, b;  // up to 8 raw elements (32 bytes)
  float s;     // FP8 block / I8 row / NVFP4 group * global scale
};

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
  hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint4 floats_to_half8(const float* f) {
  return make_uint4(pack_half2(f[0], f[1]), pack_half2(f[2], f[3]), pack_half2(f[4], f[5]),
                    pack_half2(f[6], f[7]));
}

// Raw bits of 8 weights at (row, k) .. (row, k+7); VEC: aligned and in bounds (row < rows).
// srow: the FP8 block-scale row of `row` (block_scale + (row / block) * column blocks), kblk:
// k / block, both computed by the caller once per row / k tile (64-bit divisions per load cost
// more than the loads).
template <DType DT, bool VEC>
__device__ __forceinline__ Raw load_w(const WeightView& w, int64_t row, int64_t k, const float* srow,
                                      uint32_t kblk) {
  Raw r;
  r.s = 1.0f;
  if constexpr (VEC) {
    if (row >= w.rows || k >= w.cols) {  // cols % 8 == 0: a group is all in or all out
      r.a = r.b = make_uint4(0, 0, 0, 0);
      return r;
    }
    const int64_t i = row * w.cols + k;
    // Quantized data in the GEMV tile layout: 8 values (k % 8 == 0) stay in one 16-byte chunk.
    const int64_t qb = DT == DType::NVFP4 ? (w.tile ? tiled_offset(row, k >> 1, w.cols >> 1, w.tile) : i >> 1)
                                          : (w.tile ? tiled_offset(row, k, w.cols, w.tile) : i);
    if constexpr (DT == DType::F32) {
      r.a = *reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + i);
      r.b = *reinterpret_cast<const uint4*>(static_cast<const float*>(w.data) + i + 4);
    } else if constexpr (DT == DType::I8) {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(w.data) + qb);
      r.a = make_uint4(v.x, v.y, 0, 0);
      r.s = w.row_scale[row];
    } else if constexpr (DT == DType::NVFP4) {  // 8 e2m1 values = 4 bytes, one 16-value group
      r.a = make_uint4(static_cast<const uint32_t*>(w.data)[qb >> 2], 0, 0, 0);
      r.s = e4m3_to_f32(w.group_scale[i >> 4]) * w.global_scale;
    } else if constexpr (DT == DType::FP8_E4M3) {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(w.data) + qb);
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

template <DType DT, bool VEC>
__device__ __forceinline__ uint4 convert_w(const Raw& r) {
  if constexpr (!VEC || DT == DType::F32) {
    float f[8];
    *reinterpret_cast<uint4*>(f) = r.a;
    *reinterpret_cast<uint4*>(f + 4) = r.b;
    return floats_to_half8(f);
  } else if constexpr (DT == DType::F16) {
    return r.a;
  } else if constexpr (DT == DType::I8) {
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = static_cast<float>(static_cast<int8_t>((e < 4 ? r.a.x : r.a.y) >> (8 * (e & 3)))) * r.s;
    return floats_to_half8(f);
  } else if constexpr (DT == DType::NVFP4) {
    float f[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // pair i holds nibbles i and i + 4, value * 2^-14
      const float2 p = __half22float2(as_h2(i == 0   ? e2m1x2_to_h2<0>(r.a.x)
                                            : i == 1 ? e2m1x2_to_h2<1>(r.a.x)
                                            : i == 2 ? e2m1x2_to_h2<2>(r.a.x)
                                                     : e2m1x2_to_h2<3>(r.a.x)));
      f[i] = p.x * (r.s * 16384.0f);
      f[i + 4] = p.y * (r.s * 16384.0f);
    }
    return floats_to_half8(f);
  } else if constexpr (DT == DType::BF16) {
    const uint32_t u[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    float f[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[2 * e] = __uint_as_float(u[e] << 16);
      f[2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
    }
    return floats_to_half8(f);
  } else {
    const uint32_t u[2] = {r.a.x, r.a.y};
    // e4m3 -> fp16 is exact (value / 256, the 256 folded into r.s); when the block scale keeps
    // every product in fp16's normal range the scaling is one fp16 multiply per pair (the scale
    // rounded to fp16 once: 2^-11, within the GEMM's fp16 tolerance), else fp32 as below.
    if (r.s >= 6.2e-5f && r.s <= 146.0f) {
      const __half2 s2 = __float2half2_rn(r.s);
      uint4 o;
      o.x = as_u32(__hmul2(as_h2(e4m3x2_to_h2<false>(u[0])), s2));
      o.y = as_u32(__hmul2(as_h2(e4m3x2_to_h2<true>(u[0])), s2));
      o.z = as_u32(__hmul2(as_h2(e4m3x2_to_h2<false>(u[1])), s2));
      o.w = as_u32(__hmul2(as_h2(e4m3x2_to_h2<true>(u[1])), s2));
      return o;
    }
    float f[8];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float2 lo = __half22float2(fp8x2_to_half2_div256(u[e]));
      const float2 hi = __half22float2(fp8x2_to_half2_div256(u[e] >> 16));
      f[4 * e] = lo.x * r.s;
      f[4 * e + 1] = lo.y * r.s;
      f[4 * e + 2] = hi.x * r.s;
      f[4 * e + 3] = hi.y * r.s;
    }
    return floats_to_half8(f);
  }
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

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
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
  Raw wr[2];
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

// The library's choice at the time: 128-token tiles for FP8 / NVFP4 from big_tile_tokens (128 by
// default), else 64.
template <DType DT>
void launch(bool vec, int64_t big_tile_tokens, const float* x, int64_t n, const WeightView& w, float* out,
            cudaStream_t s) {
  constexpr bool kBigTiles = DT == DType::FP8_E4M3 || DT == DType::NVFP4;
  if constexpr (kBigTiles) {
    if (n >= big_tile_tokens) return launch_tiles<DT, 128>(vec, x, n, w, out, s);
  }
  launch_tiles<DT, 64>(vec, x, n, w, out, s);
}

}  // namespace gemm_v0
}  // namespace cuda
}  // namespace pe
