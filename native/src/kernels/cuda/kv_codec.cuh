// Device side of the paged-KV storage formats of kernels/cpu/kv_codec.h: the SAME bytes as the
// CPU codec, so a page written by either backend reads back identically on the other.
//
//   F32, F16, BF16   plain values
//   FP8_E4M3         e4m3fn values, no scale
//   I8               int8 values, one fp32 scale per row: s = max|x| / 127, q = rint(x / s)
//   NVFP4            e2m1 values, two per byte (low nibble first), one fp32 scale per 16 values:
//                    s = max|x| / 6 over the 16, q = nearest e2m1 of x / s
//
// Encoders repeat core/dtype.cpp's integer arithmetic (round to nearest even on the fp32 bits) and
// the CPU's exact fp32 operations: the library is built with --use_fast_math, so the divisions and
// products of the scale math use div_rn_by / __fmul_rn, which stay IEEE round-to-nearest.
// (FTZ remains: an fp32 subnormal input or scale reads as 0. Subnormal inputs round to code 0 on
// the CPU too; a subnormal scale needs max|x| < 1e-36, never seen in a KV row.)
//
// Decoders widen a chunk of 8 consecutive values (one lane's share of a row in the decode kernel)
// to fp32 WITHOUT the scale and with a constant power-of-two factor removed (kUnit): FP8 goes
// through fp16 bit moves (value / 256), NVFP4 through fp16 bit moves (value / 16384), int8
// through the 2^23 float trick. The caller multiplies the chunk's dot / weight by the scale and
// the unit, which is exact for the powers of two.
#pragma once
#include "kernels/cuda/cuda_common.cuh"

namespace pe {
namespace cuda {

constexpr int kKvFp4Group = 16;

// m / d rounded to nearest (IEEE), for m >= 0 and d = 6 or 127, without div.rn's slow-path call:
// q = m * fl(1 / d) corrected by one fma residual step. Checked exhaustively on the CPU for every
// non-negative normal float with a normal quotient (the plain product differs on 7.0e8 of the
// 2.11e9 values); 0 gives 0, FTZ as __fdiv_rn.
template <int D>
__device__ __forceinline__ float div_rn_by(float m) {
  static_assert(D == 6 || D == 127, "checked for 6 and 127 only");
  constexpr float c = 1.0f / static_cast<float>(D);
  const float q = __fmul_rn(m, c);
  return __fmaf_rn(__fmaf_rn(-q, static_cast<float>(D), m), c, q);
}

// Value bytes and fp32 scales of one (token, kv head) row (kv_row_format of the CPU).
__host__ __device__ inline int64_t kv_row_bytes(DType t, int64_t D) {
  switch (t) {
    case DType::F32: return 4 * D;
    case DType::F16:
    case DType::BF16: return 2 * D;
    case DType::NVFP4: return D / 2;
    default: return D;  // FP8_E4M3, I8
  }
}
__host__ __device__ inline int64_t kv_row_scales(DType t, int64_t D) {
  return t == DType::I8 ? 1 : t == DType::NVFP4 ? D / kKvFp4Group : 0;
}

// ---- encoders (fp32 -> storage), bit-identical to core/dtype.cpp ----

__device__ __forceinline__ uint16_t kv_enc_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Every case is computed and one selected, without a branch, so the values of a row interleave
// (early returns make each value of a pass its own branch). Normal e4m3:
// exp8:mant3 rounded to nearest even on the bits, rebiased 127 -> 7, capped at 448; subnormal:
// quantum 2^-9, x * 512 exact (from the bits below 2^-6 only, so no overflow), rintf ties to
// even; 448 and up (inf too) saturate; NaN.
__device__ __forceinline__ uint8_t kv_enc_fp8(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t qn = min(((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3), 0x7eu);
  const uint32_t qs = static_cast<uint32_t>(rintf(__fmul_rn(__uint_as_float(min(a, 0x3c7fffffu)), 512.0f)));
  uint32_t q = a >= 0x3c800000u ? qn : qs;
  q = a >= 0x43e00000u ? 0x7eu : q;
  q = a > 0x7f800000u ? 0x7fu : q;
  return static_cast<uint8_t>(sign | q);
}

// Nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} (ties to the even code), saturating; NaN -> +0, as the
// CPU's walk over the midpoints. From 1 on the e2m1 values are the floats of one mantissa bit:
// the bits rounded to nearest even at bit 22 give (exponent, mantissa bit) = code + 252, 7 at most
// (saturation; inf too). Below 1 the grid is 0, .5, 1 = codes 0, 1, 2 = 2a rounded to nearest even
// by the 1.5 * 2^23 add (its low bits). ~13 instructions a value where 7 midpoint compares take
// ~28 (the attention inputs' K warp encodes on the path to the attention).
__device__ __forceinline__ uint32_t kv_enc_fp4(float f) {
  const float a = fabsf(f);
  const uint32_t u = __float_as_uint(a);
  const uint32_t hi = min((u + 0x1fffffu + ((u >> 22) & 1u)) >> 22, 259u) - 252u;
  const uint32_t lo = __float_as_uint(__fmaf_rn(a, 2.0f, 12582912.0f)) & 3u;
  const uint32_t code = a < 1.0f ? lo : hi;
  return a == a ? ((__float_as_uint(f) >> 28) & 8u) | code : 0u;
}

// ---- chunk decoders: 8 consecutive values of a row, fp32, scale and unit left out ----

template <DType KV> struct KvChunk {  // F16, BF16: 16 bytes
  static constexpr int kWords = 4;
  static constexpr float kUnit = 1.0f;
};
template <> struct KvChunk<DType::F32> {
  static constexpr int kWords = 8;
  static constexpr float kUnit = 1.0f;
};
template <> struct KvChunk<DType::FP8_E4M3> {
  static constexpr int kWords = 2;
  static constexpr float kUnit = 256.0f;
};
template <> struct KvChunk<DType::I8> {
  static constexpr int kWords = 2;
  static constexpr float kUnit = 1.0f;
};
template <> struct KvChunk<DType::NVFP4> {
  static constexpr int kWords = 1;
  static constexpr float kUnit = 16384.0f;
};

// Read-only streaming load of one chunk (the K/V bytes are read once per call).
template <int W>
__device__ __forceinline__ void kv_load_chunk(const uint8_t* p, uint32_t (&w)[W]) {
  if constexpr (W == 8) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(p) + 1);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
  } else if constexpr (W == 4) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
  } else if constexpr (W == 2) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = a.x; w[1] = a.y;
  } else {
    w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
  }
}

// Two e2m1 nibbles (low byte of b: low nibble first) -> their values / 16384 as fp16x2, exactly:
// exponent bits e and mantissa bit m land in the fp16 fields as 2^(e-15)(1+m/2) for the true
// 2^(e-1)(1+m/2), and e = 0 becomes the fp16 subnormal m * 2^-15 for m * 2^-1.
__device__ __forceinline__ __half2 fp4x2_to_half2_div16384(uint32_t b) {
  const uint32_t u = (b & 0x0fu) | ((b & 0xf0u) << 12);  // nibbles at bits 0..3 and 16..19
  const uint32_t h = ((u & 0x00070007u) << 9) | ((u & 0x00080008u) << 12);
  return *reinterpret_cast<const __half2*>(&h);
}

template <DType KV, int W>
__device__ __forceinline__ void kv_decode_chunk(const uint32_t (&w)[W], float (&x)[8]) {
  if constexpr (KV == DType::F32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(w[i]);
  } else if constexpr (KV == DType::F16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  } else if constexpr (KV == DType::BF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else if constexpr (KV == DType::FP8_E4M3) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 lo = __half22float2(fp8x2_to_half2_div256(w[i]));
      const float2 hi = __half22float2(fp8x2_to_half2_div256(w[i] >> 16));
      x[4 * i] = lo.x;
      x[4 * i + 1] = lo.y;
      x[4 * i + 2] = hi.x;
      x[4 * i + 3] = hi.y;
    }
  } else if constexpr (KV == DType::I8) {
    // Byte b (biased by 128) as the mantissa of 2^23: float(0x4b0000bb) - (2^23 + 128) = int8.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t biased = w[i] ^ 0x80808080u;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        x[4 * i + j] = __uint_as_float(__byte_perm(biased, 0x4bu, 0x4550u + j)) - 8388736.0f;
    }
  } else {  // NVFP4
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __half22float2(fp4x2_to_half2_div16384(__byte_perm(w[0], 0u, 0x4440u + j)));
      x[2 * j] = f.x;
      x[2 * j + 1] = f.y;
    }
  }
}

// ---- value pairs as fp16x2 for mma operands (attention_decode.cu), same units as above ----
// Each helper turns two values sitting at fixed byte/nibble positions of a word into one
// fp16x2 register, exactly, with integer ops only (the pair may come from two cache rows after a
// __byte_perm). FP8: bytes 1 and 3 (odd) or 0 and 2 (even) -> value / 256. I8: bytes of
// x = raw ^ 0x80808080 -> the int8 values (1024 + biased byte in the fp16 mantissa, minus 1152).
// NVFP4: low nibbles of bytes 0 and 2 (lo) or their high nibbles (hi) -> value / 16384.

__device__ __forceinline__ uint32_t kv_fp8_pair_odd(uint32_t z) {
  return (z & 0x80008000u) | ((z >> 1) & 0x3f803f80u);
}
__device__ __forceinline__ uint32_t kv_fp8_pair_even(uint32_t z) { return kv_fp8_pair_odd(z << 8); }

__device__ __forceinline__ uint32_t kv_i8_pair_even(uint32_t x) {
  const uint32_t h = (x & 0x00ff00ffu) | 0x64006400u;
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&h), __float2half2_rn(1152.0f));
  return *reinterpret_cast<const uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t kv_i8_pair_odd(uint32_t x) { return kv_i8_pair_even(x >> 8); }

__device__ __forceinline__ uint32_t kv_fp4_pair_lo(uint32_t y) {
  return ((y << 9) & 0x0e000e00u) | ((y << 12) & 0x80008000u);
}
__device__ __forceinline__ uint32_t kv_fp4_pair_hi(uint32_t y) {
  return ((y << 5) & 0x0e000e00u) | ((y << 8) & 0x80008000u);
}

// ---- one element (any head_dim; the tiled prefill kernel), scale applied ----

// Element d of cache row `row` (row = slot * n_kv_heads + kv head) as fp32.
template <DType KV>
__device__ __forceinline__ float kv_element(const void* base, const float* scales, int64_t row,
                                            int D, int d) {
  const int64_t i = row * D + d;
  if constexpr (KV == DType::F32) return static_cast<const float*>(base)[i];
  else if constexpr (KV == DType::F16) return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  else if constexpr (KV == DType::BF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
  else if constexpr (KV == DType::FP8_E4M3) return fp8_to_f32(static_cast<const uint8_t*>(base)[i]);
  else if constexpr (KV == DType::I8)
    return static_cast<float>(static_cast<const int8_t*>(base)[i]) * scales[row];
  else {
    const uint32_t b = static_cast<const uint8_t*>(base)[i >> 1];
    const __half2 h = fp4x2_to_half2_div16384(b);
    const float v = (d & 1) ? __high2float(h) : __low2float(h);
    return v * 16384.0f * scales[row * (D / kKvFp4Group) + d / kKvFp4Group];
  }
}

}  // namespace cuda
}  // namespace pe
