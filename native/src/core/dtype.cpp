// Scalar conversions between fp32 and the storage types, and bulk to_f32.
//
// Every narrowing conversion rounds to nearest, ties to even, by integer arithmetic on the fp32
// bits (no dependence on the FPU rounding mode). Special values:
//   f16:  overflow -> inf, NaN stays NaN (quiet), subnormals kept.
//   bf16: NaN stays NaN (the quiet bit is forced so truncation cannot turn it into inf).
//   fp8 e4m3fn: no infinities; |x| > 448 (and +-inf) saturate to +-448, NaN -> 0x7f (sign kept).
//   fp4 e2m1: no NaN/inf; |x| > 6 saturates to 6, NaN -> +0.
#include "core/dtype.h"

#include <cmath>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace pe {

namespace {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Decoded e4m3fn values, built once: index = byte.
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) v[i] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
  }
};

const float kFp4Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::FP8_E4M3: return 1;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::NVFP4: return 0;
  }
  return 0;
}

size_t dtype_bytes_for(DType t, int64_t n) {
  if (n <= 0) return 0;
  if (t == DType::NVFP4) return static_cast<size_t>((n + 1) / 2);
  return dtype_size(t) * static_cast<size_t>(n);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::FP8_E4M3: return "fp8_e4m3";
    case DType::I8: return "i8";
    case DType::I32: return "i32";
    case DType::NVFP4: return "nvfp4";
  }
  return "invalid";
}

bool dtype_valid(int32_t t) { return t >= 0 && t <= static_cast<int32_t>(DType::NVFP4); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);
  // Subnormal: value = mant * 2^-24, exact in fp32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                       // normal f16 (>= 2^-14)
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | static_cast<uint16_t>((r >> 13) - (112u << 10));
  }
  if (a < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself ties to 0)
  // Subnormal f16: quantum 2^-24; shift the implicit-1 mantissa into place with RNE.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24 for e in [102, 112]
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rem = m & ((1u << shift) - 1u);
  uint32_t q = m >> shift;
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

float bf16_to_f32(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float fp8e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int mant = v & 0x7;
  if (exp == 0xf && mant == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -9);
  return sign * std::ldexp(1.0f + mant / 8.0f, exp - 7);
}

uint8_t f32_to_fp8e4m3(float f) {
  const uint32_t u = bits_of(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7f;    // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;   // >= 448 (incl. inf): saturate
  if (a >= 0x3c800000u) {                     // normal e4m3 (>= 2^-6)
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // exp8:mant3 rounded
    const uint32_t q = r - (120u << 3);                          // rebias 127 -> 7
    return sign | static_cast<uint8_t>(q > 0x7e ? 0x7e : q);
  }
  // Subnormal e4m3: quantum 2^-9; the value is exactly representable as a float multiple.
  const float scaled = float_of(a) * 512.0f;  // exact (power of two)
  const float q = std::nearbyint(scaled);     // default rounding mode: ties to even
  return sign | static_cast<uint8_t>(q);      // q == 8 is the smallest normal, 0x08
}

float fp4e2m1_to_f32(uint8_t nibble) {
  const float v = kFp4Values[nibble & 0x7];
  return (nibble & 0x8) ? -v : v;
}

uint8_t f32_to_fp4e2m1(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  const float a = std::fabs(f);
  // Midpoints between neighbours; at a tie the even code (even mantissa bit) wins.
  static const float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 0;
  while (code < 7 && (a > kMid[code] || (a == kMid[code] && (code & 1)))) ++code;
  return sign | code;
}

void to_f32(DType t, const void* src, int64_t n, float* dst) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      }
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      uint32_t* d = reinterpret_cast<uint32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
      return;
    }
    case DType::FP8_E4M3: {
      static const Fp8Table table;
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = table.v[s[i]];
      return;
    }
    case DType::I8: {
      const int8_t* s = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::I32: {
      const int32_t* s = static_cast<const int32_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::NVFP4: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp4e2m1_to_f32((s[i / 2] >> ((i & 1) * 4)) & 0xf);
      return;
    }
  }
}

}  // namespace pe
