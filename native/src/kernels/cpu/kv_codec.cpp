#include "kernels/cpu/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pe {
namespace cpu {

static constexpr int64_t kFp4Group = 16;

KvRowFormat kv_row_format(DType t, int64_t D) {
  switch (t) {
    case DType::F32: return {4 * D, 0};
    case DType::F16:
    case DType::BF16: return {2 * D, 0};
    case DType::FP8_E4M3: return {D, 0};
    case DType::I8: return {D, 1};
    case DType::NVFP4:
      if (D % kFp4Group) throw std::invalid_argument("paged KV: fp4 needs head_dim % 16 == 0");
      return {D / 2, D / kFp4Group};
    default: throw std::invalid_argument(std::string("paged KV: unsupported cache dtype ") + dtype_name(t));
  }
}

static float max_abs(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

void kv_encode_row(DType t, const float* src, int64_t D, uint8_t* dst, float* scales) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, 4 * D); return;
    case DType::F16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < D; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < D; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::FP8_E4M3:
      for (int64_t i = 0; i < D; ++i) dst[i] = f32_to_fp8e4m3(src[i]);
      return;
    case DType::I8: {
      const float s = max_abs(src, D) / 127.0f;
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      for (int64_t i = 0; i < D; ++i)
        dst[i] = static_cast<uint8_t>(static_cast<int8_t>(std::lrint(std::clamp(src[i] * inv, -127.0f, 127.0f))));
      scales[0] = s;
      return;
    }
    case DType::NVFP4:
      for (int64_t g = 0; g < D / kFp4Group; ++g) {
        const float* x = src + g * kFp4Group;
        const float s = max_abs(x, kFp4Group) / 6.0f;
        const float inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (int64_t i = 0; i < kFp4Group; i += 2) {
          const uint8_t lo = f32_to_fp4e2m1(x[i] * inv), hi = f32_to_fp4e2m1(x[i + 1] * inv);
          dst[(g * kFp4Group + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
        }
        scales[g] = s;
      }
      return;
    default: kv_row_format(t, D);  // throws
  }
}

void kv_decode_row(DType t, const uint8_t* src, const float* scales, int64_t D, float* out) {
  switch (t) {
    case DType::F32: std::memcpy(out, src, 4 * D); return;
    case DType::F16:
    case DType::BF16: to_f32(t, src, D, out); return;
    case DType::FP8_E4M3:
      for (int64_t i = 0; i < D; ++i) out[i] = fp8e4m3_to_f32(src[i]);
      return;
    case DType::I8:
      for (int64_t i = 0; i < D; ++i) out[i] = static_cast<float>(static_cast<int8_t>(src[i])) * scales[0];
      return;
    case DType::NVFP4:
      for (int64_t i = 0; i < D; i += 2) {
        const float s = scales[i / kFp4Group];
        out[i] = fp4e2m1_to_f32(src[i / 2] & 0xF) * s;
        out[i + 1] = fp4e2m1_to_f32(src[i / 2] >> 4) * s;
      }
      return;
    default: kv_row_format(t, D);  // throws
  }
}

}  // namespace cpu
}  // namespace pe
