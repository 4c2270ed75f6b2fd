// Storage formats of one (token, kv head) row of a paged KV cache.
//
//   F32, F16, BF16   plain values
//   FP8_E4M3         e4m3 values, no scale (K and V after the norms are O(1)..O(100), well
//                    inside e4m3's +-448; rounding error ~6% of a value's magnitude at worst)
//   I8               int8 values with one fp32 scale per row (per token per head): x = q * s,
//                    s = max|x| / 127
//   NVFP4            e2m1 values, two per byte (low nibble first), one fp32 scale per 16 values:
//                    x = q * s, s = max|x| / 6 over the 16
// Scales live in a separate fp32 array next to the values (PagedKV::k_scale / v_scale).
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace pe {
namespace cpu {

struct KvRowFormat {
  int64_t bytes;   // value bytes per row
  int64_t scales;  // fp32 scales per row
};

// Throws std::invalid_argument for a dtype the cache cannot hold, or NVFP4 with head_dim % 16.
KvRowFormat kv_row_format(DType t, int64_t head_dim);

void kv_encode_row(DType t, const float* src, int64_t head_dim, uint8_t* dst, float* scales);
void kv_decode_row(DType t, const uint8_t* src, const float* scales, int64_t head_dim, float* out);

}  // namespace cpu
}  // namespace pe
