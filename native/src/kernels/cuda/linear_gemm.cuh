// The prefill GEMM's kernel (linear_gemm.cu launches it; tools/gpu/lab/linear_gemm times its tile
// shapes): out[n, rows] = x[n, cols] * W^T on the fp16 tensor cores, fp32 accumulation.
//
// Block tile BM tokens x BN weight rows x BK k, 8 warps as 2 (tokens) x 4 (rows), warp tile
// BM/2 x BN/4. Each k step's raw operands (x fp32, W in its storage format) are loaded from global
// memory into registers one step ahead, and kept raw while the current step's products run
// (nothing waits on those loads until the conversion after them); then converted to fp16 (x
// saturated to +-65504; BF16 -> fp16 exact in the normal range; FP8 * block scale, I8 * row scale,
// NVFP4 * group * global scale, rounded to fp16) and stored into the other half of a
// double-buffered shared tile whose rows are padded by 16 bytes (ldmatrix without bank
// conflicts). Fragments come from ldmatrix; the product is mma.sync m16n8k16 on sm_80+ and two
// m16n8k8 on sm_75 (the same fragments; linear_common.cuh). Every thread's chunks of 8 values
// share one k offset, so their addresses are a base per thread plus a k part per step (the GEMV
// tile layout's offset splits into a row part and a column part). Weights are never
// materialized in fp16 beyond one BN x BK tile. VEC = false (cols % 8 != 0, unaligned pointers):
// guarded scalar loads, decoded by weight_elem.
#pragma once
#include <algorithm>

#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace gemm {

constexpr int kThreads = 256;

// SPLIT: the next step's x tile is converted and stored after the first 16-k products, its weight
// tile after the last (instead of both after the last).
template <int BM_, int BN_, int BK_, int MINB_, bool SPLIT_ = false>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, MINB = MINB_;
  static constexpr bool SPLIT = SPLIT_;
  static constexpr int LDS = BK + 8;              // halves per shared row (16 bytes of padding)
  static constexpr int WM = BM / 2, WN = BN / 4;  // warp tile
  static constexpr int MI = WM / 16, NI = WN / 8;
  static constexpr int KC = BK / 8;               // 8-value chunks per row and k step
  static constexpr int RSTEP = kThreads / KC;     // rows between one thread's chunks
  static constexpr int XC = BM / RSTEP, WC = BN / RSTEP;  // x / W chunks per thread
  static constexpr int kSmemBytes = 2 * (BM + BN) * LDS * 2;
  static_assert(BM % RSTEP == 0 && BN % RSTEP == 0 && NI % 2 == 0 && BK % 16 == 0, "tile shape");
};

// The GEMV tile layout's byte offset (linear_common.cuh tiled_offset) as row part + column part:
// tiled_offset(row, b) == tiled_row_part(row) + tiled_col_part(b), and for R dividing 64,
// tiled_row_part(row + 64 j) == tiled_row_part(row) + 64 j * row_bytes.
__host__ __device__ __forceinline__ int64_t tiled_row_part(int64_t row, int64_t row_bytes, int tile) {
  const int lr = tile == 32 ? 5 : tile == 16 ? 4 : 3, ls = 12 - lr;
  const int rr = static_cast<int>(row & (tile - 1));
  return (((row >> lr) * (row_bytes >> ls)) << 12) + (((rr >> 3) << (6 - lr)) << 9) + ((rr & 7) << 6);
}
__host__ __device__ __forceinline__ int64_t tiled_col_part(int64_t b, int tile) {
  const int ls = tile == 32 ? 7 : tile == 16 ? 8 : 9;
  const int bb = static_cast<int>(b & ((1 << ls) - 1));
  return ((b >> ls) << 12) + ((bb >> 6) << 9) + (((bb >> 4) & 3) << 4) + (bb & 15);
}

// fp16x2 of (lo, hi), saturated to +-65504: one cvt on sm_80+, clamp + convert on sm_75 (the same
// bits for every finite input).
__device__ __forceinline__ uint32_t half2_sat(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t h;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %2, %1;" : "=r"(h) : "f"(lo), "f"(hi));
  return h;
#else
  lo = fminf(fmaxf(lo, -65504.0f), 65504.0f);
  hi = fminf(fmaxf(hi, -65504.0f), 65504.0f);
  return as_u32(__floats2half2_rn(lo, hi));
#endif
}

__device__ __forceinline__ uint4 half8_sat(const float* f) {
  return make_uint4(half2_sat(f[0], f[1]), half2_sat(f[2], f[3]), half2_sat(f[4], f[5]), half2_sat(f[6], f[7]));
}

// 8 raw weights (F32: a and b; F16 / BF16: a; FP8 / I8: a.x, a.y; NVFP4: a.x) and their scale.
struct Raw {
  uint4 a, b;
  float s;
};

// Raw -> 8 fp16 values. FP8 and I8 with a scale that keeps every product in fp16's normal range:
// the exact fp16 decode times the scale rounded to fp16 once (2^-11, inside the GEMM's fp16
// tolerance), one multiply per pair; otherwise through fp32.
template <DType DT>
__device__ __forceinline__ uint4 convert_w(const Raw& r) {
  if constexpr (DT == DType::F32) {
    float f[8];
    *reinterpret_cast<uint4*>(f) = r.a;
    *reinterpret_cast<uint4*>(f + 4) = r.b;
    return half8_sat(f);
  } else if constexpr (DT == DType::F16) {
    return r.a;
  } else if constexpr (DT == DType::BF16) {
    const uint32_t u[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    float f[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[2 * e] = __uint_as_float(u[e] << 16);
      f[2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
    }
    return half8_sat(f);
  } else if constexpr (DT == DType::I8) {
    if (r.s >= 6.2e-5f && r.s <= 511.0f) {  // |v| <= 128: v * s <= 65408
      const __half2 s2 = __float2half2_rn(r.s);
      return make_uint4(as_u32(__hmul2(as_h2(i8x2_to_h2<false>(r.a.x)), s2)),
                        as_u32(__hmul2(as_h2(i8x2_to_h2<true>(r.a.x)), s2)),
                        as_u32(__hmul2(as_h2(i8x2_to_h2<false>(r.a.y)), s2)),
                        as_u32(__hmul2(as_h2(i8x2_to_h2<true>(r.a.y)), s2)));
    }
    float f[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      f[e] = static_cast<float>(static_cast<int8_t>((e < 4 ? r.a.x : r.a.y) >> (8 * (e & 3)))) * r.s;
    return half8_sat(f);
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
    return half8_sat(f);
  } else {  // FP8: e4m3 -> fp16 is exact as value / 256, the 256 folded into r.s
    const uint32_t u[2] = {r.a.x, r.a.y};
    if (r.s >= 6.2e-5f && r.s <= 146.0f) {
      const __half2 s2 = __float2half2_rn(r.s);
      return make_uint4(as_u32(__hmul2(as_h2(e4m3x2_to_h2<false>(u[0])), s2)),
                        as_u32(__hmul2(as_h2(e4m3x2_to_h2<true>(u[0])), s2)),
                        as_u32(__hmul2(as_h2(e4m3x2_to_h2<false>(u[1])), s2)),
                        as_u32(__hmul2(as_h2(e4m3x2_to_h2<true>(u[1])), s2)));
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
    return half8_sat(f);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// One thread's weight chunks: rows row0 + j * RSTEP (j < WC), values k .. k + 7 of each k step.
// Per-row state is computed once (no 64-bit division or multiply in the loop).
template <DType DT, bool VEC, class T>
struct WeightChunks {
  static constexpr int kElemBytes = DT == DType::F32 ? 4 : (DT == DType::F16 || DT == DType::BF16) ? 2 : 1;
  const uint8_t* base;  // VEC: w.data + the byte offset of row0 at k = 0
  int64_t row_step;     // bytes between chunk j and j + 1
  int64_t row0;
  int64_t gs0;          // NVFP4: row0's first group scale
  int srow[T::WC];      // FP8: the block-scale row offset of each chunk's row
  float rs[T::WC];      // I8: each chunk's row scale

  __device__ __forceinline__ void init(const WeightView& w, int64_t r0) {
    row0 = r0;
    const int64_t row_bytes = DT == DType::NVFP4 ? w.cols / 2 : w.cols * kElemBytes;
    row_step = row_bytes * T::RSTEP;
    base = static_cast<const uint8_t*>(w.data) + (w.tile ? tiled_row_part(r0, row_bytes, w.tile) : r0 * row_bytes);
    gs0 = r0 * (w.cols >> 4);
    const int64_t ncb = (w.cols + w.block - 1) / w.block;
#pragma unroll
    for (int j = 0; j < T::WC; ++j) {
      const int64_t row = min(r0 + j * T::RSTEP, w.rows - 1);
      if constexpr (DT == DType::FP8_E4M3) srow[j] = static_cast<int>((row / w.block) * ncb);
      if constexpr (DT == DType::I8) rs[j] = VEC ? w.row_scale[row] : 1.0f;
    }
  }

  __device__ __forceinline__ void load(const WeightView& w, int64_t k, Raw* r) const {
    if constexpr (VEC) {
      // cols % 8 == 0: a chunk is all in or all out.
      const int64_t b = DT == DType::NVFP4 ? k >> 1 : k * kElemBytes;
      const int64_t col = w.tile ? tiled_col_part(b, w.tile) : b;
      const int kblk = DT == DType::FP8_E4M3 ? static_cast<int>(static_cast<uint32_t>(k) / static_cast<uint32_t>(w.block)) : 0;
#pragma unroll
      for (int j = 0; j < T::WC; ++j) {
        r[j].a = r[j].b = make_uint4(0, 0, 0, 0);
        r[j].s = 0.0f;
        if (row0 + j * T::RSTEP >= w.rows || k >= w.cols) continue;
        const uint8_t* p = base + j * row_step + col;
        if constexpr (DT == DType::F32) {
          r[j].a = __ldg(reinterpret_cast<const uint4*>(p));
          r[j].b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
        } else if constexpr (DT == DType::F16 || DT == DType::BF16) {
          r[j].a = __ldg(reinterpret_cast<const uint4*>(p));
        } else if constexpr (DT == DType::NVFP4) {
          r[j].a.x = __ldg(reinterpret_cast<const uint32_t*>(p));
          const int64_t g = gs0 + j * T::RSTEP * (w.cols >> 4) + (k >> 4);
          r[j].s = e4m3_to_f32(__ldg(w.group_scale + g)) * w.global_scale;
        } else {
          const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
          r[j].a.x = v.x;
          r[j].a.y = v.y;
          if constexpr (DT == DType::I8) r[j].s = rs[j];
          else r[j].s = __ldg(w.block_scale + srow[j] + kblk) * 256.0f;
        }
      }
    } else {  // decoded here (scales applied) as 8 fp32 values: converted as F32
#pragma unroll
      for (int j = 0; j < T::WC; ++j) {
        const int64_t row = row0 + j * T::RSTEP;
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = (row < w.rows && k + e < w.cols) ? weight_elem(w, row, k + e) : 0.0f;
        r[j].a = *reinterpret_cast<const uint4*>(f);
        r[j].b = *reinterpret_cast<const uint4*>(f + 4);
        r[j].s = 1.0f;
      }
    }
  }
};

// Tile order (L2 reuse): groups of group_m token tiles sweep every weight tile, the token tiles of
// a group side by side, so a group's x rows stay in L2 while the weights stream once per group.
// pair_store: out rows even and out 8-byte aligned (two accumulators per 8-byte store).
template <DType DT, bool VEC, class T>
__global__ void __launch_bounds__(kThreads, T::MINB)
    gemm_kernel(const float* __restrict__ x, int64_t n, WeightView w, float* __restrict__ out, int num_n,
                int group_m, bool pair_store) {
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, LDS = T::LDS, MI = T::MI, NI = T::NI;
  constexpr int XC = T::XC, WC = T::WC, RSTEP = T::RSTEP;
  extern __shared__ __align__(16) uint8_t gemm_smem[];
  __half* As = reinterpret_cast<__half*>(gemm_smem);  // [2][BM][LDS]
  __half* Bs = As + 2 * BM * LDS;                     // [2][BN][LDS]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const int num_m = static_cast<int>((n + BM - 1) / BM);
  const int per_group = group_m * num_n, gid = static_cast<int>(blockIdx.x) / per_group;
  const int first_m = gid * group_m, gsize = min(num_m - first_m, group_m);
  const int in_group = static_cast<int>(blockIdx.x) - gid * per_group;
  const int64_t m0 = static_cast<int64_t>(first_m + in_group % gsize) * BM;
  const int64_t n0 = static_cast<int64_t>(in_group / gsize) * BN;
  const int64_t cols = w.cols;
  const int lr = tid / T::KC, lk = (tid % T::KC) * 8;  // this thread's first row and its k offset
  const int n_k = static_cast<int>((cols + BK - 1) / BK);

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  WeightChunks<DT, VEC, T> wc;
  wc.init(w, n0 + lr);
  const float* xrow = x + (m0 + lr) * cols + lk;  // chunk j: + j * RSTEP * cols
  float4 xr[XC][2];
  Raw wr[WC];
  auto load = [&](int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BK, k = k0 + lk;
#pragma unroll
    for (int j = 0; j < XC; ++j) {
      const int64_t t = m0 + lr + j * RSTEP;
      xr[j][0] = xr[j][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if constexpr (VEC) {
        if (t < n && k < cols) {
          const float4* p = reinterpret_cast<const float4*>(xrow + j * RSTEP * cols + k0);
          xr[j][0] = __ldg(p);
          xr[j][1] = __ldg(p + 1);
        }
      } else {
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = (t < n && k + e < cols) ? x[t * cols + k + e] : 0.0f;
        xr[j][0] = make_float4(f[0], f[1], f[2], f[3]);
        xr[j][1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
    wc.load(w, k, wr);
  };
  auto store_x = [&](int buf) {
#pragma unroll
    for (int j = 0; j < XC; ++j) {
      const float f[8] = {xr[j][0].x, xr[j][0].y, xr[j][0].z, xr[j][0].w,
                          xr[j][1].x, xr[j][1].y, xr[j][1].z, xr[j][1].w};
      *reinterpret_cast<uint4*>(As + (buf * BM + lr + j * RSTEP) * LDS + lk) = half8_sat(f);
    }
  };
  auto store_w = [&](int buf) {
#pragma unroll
    for (int j = 0; j < WC; ++j)
      *reinterpret_cast<uint4*>(Bs + (buf * BN + lr + j * RSTEP) * LDS + lk) =
          convert_w<VEC ? DT : DType::F32>(wr[j]);
  };

  load(0);
  store_x(0);
  store_w(0);
  __syncthreads();
  for (int kt = 0; kt < n_k; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_k) load(kt + 1);
    const __half* a_s = As + (buf * BM + warp_m * T::WM) * LDS;
    const __half* b_s = Bs + (buf * BN + warp_n * T::WN) * LDS;
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      uint32_t af[MI][4], bf[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
        ldmatrix_x4(af[mi], a_s + (mi * 16 + (lane & 15)) * LDS + ks + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < NI / 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, b_s + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + ks + ((lane >> 3) & 1) * 8);
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);
      if (T::SPLIT && ks == 0 && kt + 1 < n_k) store_x(buf ^ 1);
    }
    if (kt + 1 < n_k) {
      if (!T::SPLIT) store_x(buf ^ 1);
      store_w(buf ^ 1);
    }
    __syncthreads();
  }
  // Epilogue: c0, c1 at (token g, rows 2t, 2t + 1), c2, c3 at token g + 8.
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = m0 + warp_m * T::WM + mi * 16 + (lane >> 2) + h * 8;
      if (t >= n) continue;
      float* orow = out + t * w.rows;
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int64_t r = n0 + warp_n * T::WN + ni * 8 + (lane & 3) * 2;
        const float c0 = acc[mi][ni][2 * h], c1 = acc[mi][ni][2 * h + 1];
        if (pair_store && r + 1 < w.rows) {
          *reinterpret_cast<float2*>(orow + r) = make_float2(c0, c1);
        } else {
          if (r < w.rows) orow[r] = c0;
          if (r + 1 < w.rows) orow[r + 1] = c1;
        }
      }
    }
}

// One launch of gemm_kernel<DT, VEC, T> (the library's dispatch, linear_gemm.cu, picks T; the lab
// launches every tile shape it times through this).
template <DType DT, bool VEC, class T>
void launch(const float* x, int64_t n, const WeightView& w, float* out, cudaStream_t s) {
  const int64_t num_n = grid_1d(w.rows, T::BN), num_m = grid_1d(n, T::BM);
  if (num_n * num_m > 0x7fffffffLL) fail(PE_ERR_INVALID_ARGUMENT, "cuda::linear: too many tiles");
  // ~16 MB of x rows per group (fp32): well inside the H200's 50 MB L2; on a 2080 Ti (5.5 MB) a
  // group still shares its rows between the tiles resident at once.
  const int64_t group_m = std::min<int64_t>(std::max<int64_t>((int64_t(16) << 20) / (int64_t(T::BM) * w.cols * 4), 1), num_m);
  auto kernel = gemm_kernel<DT, VEC, T>;
  // Over 48 KB of dynamic shared memory is opted into per function and device: every launch.
  PE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes));
  const bool pair_store = w.rows % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  kernel<<<static_cast<unsigned>(num_n * num_m), kThreads, T::kSmemBytes, s>>>(
      x, n, w, out, static_cast<int>(num_n), static_cast<int>(group_m), pair_store);
}

}  // namespace gemm
}  // namespace cuda
}  // namespace pe
