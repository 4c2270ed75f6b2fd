// Internals of attention_paged (attention.cpp) shared by its two ways of computing a key tile:
// the cache rows of one tile as fp32 pointers, and the tiled path's entry point
// (attention_tiled.cpp).
#pragma once
#include <cstdint>

#include "kernels/cpu/kv_codec.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {

constexpr int64_t kKeyTile = 128;  // keys per tile of the online softmax (128: 4 % faster than 64)

// Row index of (position t, kv head) in the cache: value bytes at row * fmt.bytes, scales at
// row * fmt.scales.
inline int64_t kv_row_index(const PagedKV& kv, const int32_t* page_table, int64_t t, int64_t kvh) {
  const int64_t page = page_table[t / kv.page_size];
  return (page * kv.page_size + t % kv.page_size) * kv.n_kv_heads + kvh;
}

// fp32 view of one cached row: in place for F32, else decoded into buf.
inline const float* kv_row(const PagedKV& kv, const KvRowFormat& fmt, const void* base, const float* scales,
                           int64_t row, float* buf) {
  const uint8_t* src = static_cast<const uint8_t*>(base) + row * fmt.bytes;
  if (kv.dtype == DType::F32) return reinterpret_cast<const float*>(src);
  kv_decode_row(kv.dtype, src, scales ? scales + row * fmt.scales : nullptr, kv.head_dim, buf);
  return buf;
}

inline void prefetch_row(const PagedKV& kv, const KvRowFormat& fmt, const int32_t* page_table, int64_t t,
                         int64_t kvh) {
  const int64_t row = kv_row_index(kv, page_table, t, kvh);
  const char* k = static_cast<const char*>(kv.k) + row * fmt.bytes;
  const char* v = static_cast<const char*>(kv.v) + row * fmt.bytes;
  for (int64_t b = 0; b < fmt.bytes; b += 64) {
    __builtin_prefetch(k + b);
    __builtin_prefetch(v + b);
  }
}

// kp[j], vp[j]: fp32 K and V rows of keys t0 + j (j < kt <= kKeyTile) of kv head g; rows that
// need decoding go to buf [2 * kKeyTile, head_dim]. Rows of one head are scattered (stride
// n_kv_heads * head_dim, pages anywhere), so the next tile (keys up to n_keys) is prefetched
// while this one is computed.
inline void tile_rows(const PagedKV& kv, const KvRowFormat& fmt, const int32_t* page_table, int64_t g,
                      int64_t t0, int64_t kt, int64_t n_keys, float* buf, const float** kp, const float** vp) {
  const int64_t D = kv.head_dim;
  for (int64_t j = 0; j < kt; ++j) {
    const int64_t row = kv_row_index(kv, page_table, t0 + j, g);
    kp[j] = kv_row(kv, fmt, kv.k, kv.k_scale, row, buf + j * D);
    vp[j] = kv_row(kv, fmt, kv.v, kv.v_scale, row, buf + (kKeyTile + j) * D);
  }
  for (int64_t j = t0 + kKeyTile; j < n_keys && j < t0 + 2 * kKeyTile; ++j) prefetch_row(kv, fmt, page_table, j, g);
}

// attention_paged over tasks of (kv head, block of QB queries x all heads of its group), for
// blocks of at least 8 query vectors (QB * group >= 8, QB <= n_q); arguments as attention_paged.
void attention_tiled(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads, const PagedKV& kv,
                     const int32_t* page_table, float scale, const float* gate, float* out, int64_t QB);

}  // namespace cpu
}  // namespace pe
