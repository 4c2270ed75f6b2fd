// Paged KV cache write and causal GQA attention over it.
//
// Cache layout (PagedKV): k, v [n_pages, page_size, n_kv_heads, head_dim] stored as F32, F16 or
// BF16; token t of a sequence is row t % page_size of page page_table[t / page_size].
// kv_write: k, v [n, n_kv_heads, head_dim] fp32 -> the cache rows of positions start_pos + i.
// attention_paged: for query i (position P = q_start_pos + i) and head h (kv head h / group):
//   s_t = scale * q.k_t for t = 0 .. P; p = softmax(s) (fp32, max-subtracted);
//   o = sum_t p_t v_t; o *= sigmoid(gate) when gate is given (fused output gate).
// Two passes per (query, head): scores into a thread-local buffer, then the weighted V sum.
// Parallel over (queries x heads), in chunks so the causal (triangular) work balances.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

void check_kv_dtype(DType t) {
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16)
    throw std::invalid_argument(std::string("paged KV: unsupported cache dtype ") + dtype_name(t));
}

// Element offset of (position t, kv head) in the cache.
inline int64_t kv_offset(const PagedKV& kv, const int32_t* page_table, int64_t t, int64_t kvh) {
  const int64_t page = page_table[t / kv.page_size];
  return ((page * kv.page_size + t % kv.page_size) * kv.n_kv_heads + kvh) * kv.head_dim;
}

// fp32 view of one cached row: in place for F32, else converted into buf.
inline const float* kv_row(const PagedKV& kv, const void* base, int64_t off, float* buf) {
  if (kv.dtype == DType::F32) return static_cast<const float*>(base) + off;
  to_f32(kv.dtype, static_cast<const uint16_t*>(base) + off, kv.head_dim, buf);
  return buf;
}

void store_row(DType t, const float* src, int64_t n, void* base, int64_t off) {
  if (t == DType::F32) {
    std::memcpy(static_cast<float*>(base) + off, src, static_cast<size_t>(n) * 4);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(base) + off;
  if (t == DType::F16) {
    for (int64_t j = 0; j < n; ++j) d[j] = f32_to_f16(src[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) d[j] = f32_to_bf16(src[j]);
  }
}

}  // namespace

void kv_write(const PagedKV& kv, const int32_t* page_table, int64_t start_pos, int64_t n,
              const float* k, const float* v) {
  check_kv_dtype(kv.dtype);
  const int64_t row = kv.n_kv_heads * kv.head_dim;
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t off = kv_offset(kv, page_table, start_pos + i, 0);
          store_row(kv.dtype, k + i * row, row, kv.k, off);
          store_row(kv.dtype, v + i * row, row, kv.v, off);
        }
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(row, 1)));
}

void attention_paged(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                     const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                     float* out) {
  check_kv_dtype(kv.dtype);
  if (n_q <= 0) return;
  if (kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0)
    throw std::invalid_argument("attention_paged: n_heads must be a multiple of n_kv_heads");
  const int64_t D = kv.head_dim;
  const int64_t group = n_heads / kv.n_kv_heads;
  const int64_t n_keys_max = q_start_pos + n_q;
  // One (query, head) costs ~2 * keys * D flops: keep each chunk above ~32K of them.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(n_keys_max * D, 1));

  parallel_for(
      n_q * n_heads,
      [&](int64_t begin, int64_t end) {
        float* scores = scratch(0, static_cast<size_t>(n_keys_max));
        float* acc = scratch(1, static_cast<size_t>(D));
        float* kbuf = scratch(2, static_cast<size_t>(D));
        float* vbuf = scratch(3, static_cast<size_t>(D));
        for (int64_t task = begin; task < end; ++task) {
          const int64_t i = task / n_heads, h = task % n_heads;
          const int64_t kvh = h / group;
          const int64_t n_keys = q_start_pos + i + 1;
          const float* qv = q + (i * n_heads + h) * D;

          float m = -INFINITY;
          for (int64_t t = 0; t < n_keys; ++t) {
            const float* kr = kv_row(kv, kv.k, kv_offset(kv, page_table, t, kvh), kbuf);
            const float s = scale * dot(qv, kr, D);
            scores[t] = s;
            m = std::max(m, s);
          }
          float sum = 0.0f;
          for (int64_t t = 0; t < n_keys; ++t) {
            scores[t] = std::exp(scores[t] - m);
            sum += scores[t];
          }
          std::fill(acc, acc + D, 0.0f);
          for (int64_t t = 0; t < n_keys; ++t) {
            const float* vr = kv_row(kv, kv.v, kv_offset(kv, page_table, t, kvh), vbuf);
            axpy(scores[t], vr, acc, D);
          }
          const float inv = 1.0f / sum;
          float* o = out + (i * n_heads + h) * D;
          if (gate) {
            const float* gv = gate + (i * n_heads + h) * D;
            for (int64_t j = 0; j < D; ++j) o[j] = acc[j] * inv * sigmoid(gv[j]);
          } else {
            for (int64_t j = 0; j < D; ++j) o[j] = acc[j] * inv;
          }
        }
      },
      grain);
}

}  // namespace cpu
}  // namespace pe
