// Parts of the tensor-core quantized GEMV (linear_gemv_q.cu): the x split and the weight decode.
// See linear_gemv_q.cu for the "swap AB" layout these feed: A = [x_hi; x_lo] as fp16 pairs, B =
// the weights decoded to fp16 pairs, both in the same k order.
#pragma once
#include "kernels/cuda/linear_common.cuh"

namespace pe {
namespace cuda {
namespace gemv_q {

constexpr int kWarps = 8;  // per block: they split the columns and sum through shared memory

// The tuning every launch reads (GemvTuning, cuda_ops.h; linear_gemv_q_tuning.cu, with its
// environment switches) and the rows per warp of a swiglu launch (the tile's, or at least 2).
extern GemvTuning g_tuning;
int swiglu_rows_per_warp(const WeightView& w);

template <DType DT>
__host__ __device__ constexpr int values_per_chunk() { return DT == DType::NVFP4 ? 32 : 16; }

// x_hi + x_lo == x (to ~2^-22 relative), both fp16x2. sm_80+ code: the saturating conversion
// (cvt.rn.satfinite.f16x2.f32) does the range clamp itself, 4 instructions a pair fewer (64 of
// the 468 in a 32-row FP8 step): the same bits for |x| <= 65504; beyond it hi + lo keeps x up to
// ~131008 (the clamp below gives 65504) and NaN stays NaN (the clamp makes it -65504).
__device__ __forceinline__ void split_x(float a, float b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t h;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %2, %1;" : "=r"(h) : "f"(a), "f"(b));  // a: low half, as __floats2half2_rn
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  hi = h;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %2, %1;" : "=r"(lo) : "f"(a - f.x), "f"(b - f.y));
#else
  a = fminf(fmaxf(a, -65504.0f), 65504.0f);
  b = fminf(fmaxf(b, -65504.0f), 65504.0f);
  const __half2 h = __floats2half2_rn(a, b);
  const float2 f = __half22float2(h);
  hi = as_u32(h);
  lo = as_u32(__floats2half2_rn(a - f.x, b - f.y));
#endif
}

// FP8 values come out of decode_chunk divided by this (the integer decode keeps the e4m3 bits as
// fp16 bits: value / 256; cvt.rn.f16x2.e4m3x2, sm_89+, gives the value itself). Both exact.
template <bool kCvt>
__device__ __forceinline__ float fp8_decode_unit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return kCvt ? 1.0f : 256.0f;
#else
  return 256.0f;
#endif
}

// One 16-byte chunk -> NP fp16 pairs, in the pair order split_x is fed with (see x_pairs).
// kCvt: FP8 by the hardware conversion where the GPU has it (one instruction per pair instead of
// three), scaled as fp8_decode_unit<kCvt>() says.
template <DType DT, bool kCvt = false>
__device__ __forceinline__ void decode_chunk(const uint4& raw, uint32_t gsc, uint32_t* wh) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (DT == DType::FP8_E4M3 && kCvt) {
#pragma unroll
    for (int q = 0; q < 4; ++q) e4m3x4_cvt(u[q], wh[2 * q], wh[2 * q + 1]);  // bytes 0,1 -> pair 2q, 2,3 -> 2q + 1
    return;
  }
#endif
  if constexpr (DT == DType::FP8_E4M3) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      wh[2 * q] = e4m3x2_to_h2<false>(u[q]);
      wh[2 * q + 1] = e4m3x2_to_h2<true>(u[q]);
    }
  } else if constexpr (DT == DType::I8) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      wh[2 * q] = i8x2_to_h2<false>(u[q]);
      wh[2 * q + 1] = i8x2_to_h2<true>(u[q]);
    }
  } else {
    // Group scales of the chunk's two 16-value groups, * 2^7 (exact products, header).
    const __half2 s = __hmul2(as_h2(e4m3x2_to_h2<false>(gsc)), __float2half2_rn(32768.0f));
    const __half2 s0 = __low2half2(s), s1 = __high2half2(s);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const __half2 sq = q < 2 ? s0 : s1;
      wh[4 * q + 0] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<0>(u[q])), sq));
      wh[4 * q + 1] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<1>(u[q])), sq));
      wh[4 * q + 2] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<2>(u[q])), sq));
      wh[4 * q + 3] = as_u32(__hmul2(as_h2(e2m1x2_to_h2<3>(u[q])), sq));
    }
  }
}

// The x values of one chunk (VPC floats at xp, or zeros) as hi/lo pairs matching decode_chunk:
// fp8/int8 pair p = columns (2p, 2p+1); e2m1 pair 4q + i = columns (8q + i, 8q + i + 4).
// x_load + x_split = x_pairs, for callers that put several chunks' loads in flight first.
template <DType DT>
__device__ __forceinline__ void x_load(const float* xp, bool valid, float* f) {
#pragma unroll
  for (int e = 0; e < values_per_chunk<DT>(); e += 4) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (valid) v = load_nc_f4(xp + e);
    f[e] = v.x; f[e + 1] = v.y; f[e + 2] = v.z; f[e + 3] = v.w;
  }
}
template <DType DT>
__device__ __forceinline__ void x_split(const float* f, uint32_t* xh, uint32_t* xl) {
#pragma unroll
  for (int p = 0; p < values_per_chunk<DT>() / 2; ++p) {
    const int c0 = DT == DType::NVFP4 ? 8 * (p / 4) + p % 4 : 2 * p;
    const int c1 = DT == DType::NVFP4 ? c0 + 4 : c0 + 1;
    split_x(f[c0], f[c1], xh[p], xl[p]);
  }
}
template <DType DT>
__device__ __forceinline__ void x_pairs(const float* xp, bool valid, uint32_t* xh, uint32_t* xl) {
  float f[values_per_chunk<DT>()];
  x_load<DT>(xp, valid, f);
  x_split<DT>(f, xh, xl);
}

// x staged in shared memory as the mma A operands: token -> chunk -> NQ uint4 {hi, lo, hi, lo},
// a chunk's quads padded by 16 bytes and tokens by 64 (mod 128), so the 8 lanes (2 tokens x 4
// chunks) of each shared-memory phase hit distinct banks.
template <DType DT>
struct StagedX {
  static constexpr int kQuads = values_per_chunk<DT>() / 4;
  static constexpr int kChunkPitch = kQuads * 16 + 16;
  __host__ __device__ static int64_t token_pitch(int64_t cols) {
    const int64_t b = cols / values_per_chunk<DT>() * kChunkPitch;
    return (b + 127) / 128 * 128 + 64;
  }
  __host__ __device__ static int64_t bytes(int64_t n, int64_t cols) { return n * token_pitch(cols); }
};

}  // namespace gemv_q
}  // namespace cuda
}  // namespace pe
