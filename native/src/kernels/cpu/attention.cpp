// Paged KV cache write and causal GQA attention over it.
//
// Cache layout (PagedKV): k, v [n_pages, page_size, n_kv_heads] rows of head_dim values stored in
// one of the formats of kv_codec.h (F32, F16, BF16, FP8_E4M3, I8 + scale, NVFP4 + scales); token
// t of a sequence is row t % page_size of page page_table[t / page_size].
// kv_write: k, v [n, n_kv_heads, head_dim] fp32 -> the cache rows of positions start_pos + i.
// attention_paged: for query i (position P = q_start_pos + i) and head h (kv head h / group):
//   s_t = scale * q.k_t for t = 0 .. P; p = softmax(s) (fp32, max-subtracted);
//   o = sum_t p_t v_t; o *= sigmoid(gate) when gate is given (fused output gate).
// Flash-style: keys in tiles of 64 with an online (running max) softmax, so memory does not grow
// with the context. A task holds up to 16 queries x the heads of one KV group: each K/V row is
// loaded (and converted) once per task and reused by all its query vectors; scores come from a
// register-tiled 4 keys x 4 queries dot kernel. Parallel over (kv heads x query blocks x head
// blocks); blocks shrink for decode so every thread gets work.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/kv_codec.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

constexpr int64_t kKeyTile = 64;  // keys per tile of the online softmax

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

void prefetch_row(const PagedKV& kv, const KvRowFormat& fmt, const int32_t* page_table, int64_t t, int64_t kvh) {
  const int64_t row = kv_row_index(kv, page_table, t, kvh);
  const char* k = static_cast<const char*>(kv.k) + row * fmt.bytes;
  const char* v = static_cast<const char*>(kv.v) + row * fmt.bytes;
  for (int64_t b = 0; b < fmt.bytes; b += 64) {
    __builtin_prefetch(k + b);
    __builtin_prefetch(v + b);
  }
}

}  // namespace

void kv_write(const PagedKV& kv, const int32_t* page_table, int64_t start_pos, int64_t n,
              const float* k, const float* v) {
  const KvRowFormat fmt = kv_row_format(kv.dtype, kv.head_dim);
  if (fmt.scales && (!kv.k_scale || !kv.v_scale))
    throw std::invalid_argument(std::string("paged KV: ") + dtype_name(kv.dtype) + " cache without scales");
  const int64_t D = kv.head_dim, H = kv.n_kv_heads;
  parallel_for(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          for (int64_t h = 0; h < H; ++h) {
            const int64_t row = kv_row_index(kv, page_table, start_pos + i, h);
            kv_encode_row(kv.dtype, k + (i * H + h) * D, D, static_cast<uint8_t*>(kv.k) + row * fmt.bytes,
                          kv.k_scale ? kv.k_scale + row * fmt.scales : nullptr);
            kv_encode_row(kv.dtype, v + (i * H + h) * D, D, static_cast<uint8_t*>(kv.v) + row * fmt.bytes,
                          kv.v_scale ? kv.v_scale + row * fmt.scales : nullptr);
          }
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(H * D, 1)));
}

void attention_paged(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                     const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                     float* out) {
  const KvRowFormat fmt = kv_row_format(kv.dtype, kv.head_dim);
  if (n_q <= 0) return;
  if (kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0)
    throw std::invalid_argument("attention_paged: n_heads must be a multiple of n_kv_heads");
  const int64_t D = kv.head_dim, Hkv = kv.n_kv_heads;
  const int64_t group = n_heads / Hkv;
  // A task is (kv head, block of QB queries, block of HB heads of its group): its query vectors
  // share every K/V row it loads. Blocks shrink until there are enough tasks for the threads.
  const int64_t threads = num_threads();
  constexpr int64_t kMaxVecs = 64;  // query vectors per task (QB * HB)
  int64_t HB = std::min<int64_t>(group, 8);
  int64_t QB = std::min<int64_t>(16, kMaxVecs / HB);
  auto n_tasks = [&] { return Hkv * ((n_q + QB - 1) / QB) * ((group + HB - 1) / HB); };
  while (QB > 1 && n_tasks() < 2 * threads) QB /= 2;
  while (HB > 1 && n_tasks() < 2 * threads) HB = (HB + 1) / 2;
  const int64_t n_qb = (n_q + QB - 1) / QB, n_hb = (group + HB - 1) / HB;
  const int64_t max_vecs = QB * HB;
  const int64_t keys_max = q_start_pos + n_q;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(keys_max * D * max_vecs, 1));

  parallel_for(
      Hkv * n_qb * n_hb,
      [&](int64_t begin, int64_t end) {
        float* acc = scratch(0, static_cast<size_t>(max_vecs * D));
        float* s = scratch(1, static_cast<size_t>(max_vecs * kKeyTile));
        float* ml = scratch(2, static_cast<size_t>(2 * max_vecs));
        float* kvbuf = scratch(3, static_cast<size_t>(2 * kKeyTile * D));
        const float* qv[kMaxVecs];
        int64_t qpos[kMaxVecs];
        const float* kp[kKeyTile];
        const float* vp[kKeyTile];
        for (int64_t task = begin; task < end; ++task) {
          const int64_t g = task / (n_qb * n_hb), qb = (task / n_hb) % n_qb, hb = task % n_hb;
          const int64_t i0 = qb * QB, i1 = std::min(n_q, i0 + QB);
          const int64_t h0 = g * group + hb * HB, h1 = std::min(g * group + group, h0 + HB);
          int64_t nv = 0;
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t h = h0; h < h1; ++h) {
              qv[nv] = q + (i * n_heads + h) * D;
              qpos[nv++] = q_start_pos + i;
            }
          float* m = ml;
          float* l = ml + nv;
          std::fill(m, m + nv, -INFINITY);
          std::fill(l, l + nv, 0.0f);
          std::fill(acc, acc + nv * D, 0.0f);
          const int64_t n_keys = q_start_pos + i1;
          for (int64_t t0 = 0; t0 < n_keys; t0 += kKeyTile) {
            const int64_t kt = std::min<int64_t>(kKeyTile, n_keys - t0);
            for (int64_t j = 0; j < kt; ++j) {
              const int64_t row = kv_row_index(kv, page_table, t0 + j, g);
              kp[j] = kv_row(kv, fmt, kv.k, kv.k_scale, row, kvbuf + j * D);
              vp[j] = kv_row(kv, fmt, kv.v, kv.v_scale, row, kvbuf + (kKeyTile + j) * D);
            }
            // Rows of one head are scattered (stride n_kv_heads * D, pages anywhere): prefetch the
            // next tile while this one is computed.
            for (int64_t j = t0 + kKeyTile; j < std::min(n_keys, t0 + 2 * kKeyTile); ++j)
              prefetch_row(kv, fmt, page_table, j, g);
            // Scores of this tile: s[v, j] = scale * q_v . k_j, -inf past the query's position.
            float res[16];
            for (int64_t j = 0; j < kt; j += 4) {
              const int nr = static_cast<int>(std::min<int64_t>(4, kt - j));
              for (int64_t v = 0; v < nv; v += 4) {
                const int nt = static_cast<int>(std::min<int64_t>(4, nv - v));
                dot_tile_fn(nr, nt)(kp + j, qv + v, D, res);
                for (int r = 0; r < nr; ++r)
                  for (int c = 0; c < nt; ++c)
                    s[(v + c) * kKeyTile + j + r] =
                        t0 + j + r <= qpos[v + c] ? scale * res[r * 4 + c] : -INFINITY;
              }
            }
            // Online softmax: rescale the running sums to the new max, turn scores into weights.
            for (int64_t v = 0; v < nv; ++v) {
              float* sv = s + v * kKeyTile;
              const float tile_max = max_of(sv, kt);
              if (tile_max == -INFINITY) {  // the whole tile is in this query's future
                std::fill(sv, sv + kt, 0.0f);
                continue;
              }
              const float new_m = std::max(m[v], tile_max);
              const float corr = exp_nonpos(m[v] - new_m);
              float sum = 0.0f;
              for (int64_t j = 0; j < kt; ++j) {
                sv[j] = exp_nonpos(sv[j] - new_m);  // masked (-inf) scores become 0
                sum += sv[j];
              }
              l[v] = l[v] * corr + sum;
              m[v] = new_m;
              float* av = acc + v * D;
              if (corr != 1.0f)
                for (int64_t d = 0; d < D; ++d) av[d] *= corr;
            }
            // acc[v, :] += sum_j w[v, j] v_j: a [nv, kt] x [kt, D] product on the V row pointers.
            gemm_rows(nv, D, kt, 1.0f, s, kKeyTile, [&](int64_t j) { return vp[j]; }, 1.0f, acc, D);
          }
          for (int64_t v = 0; v < nv; ++v) {
            const int64_t off = qv[v] - q;  // same [n_q, n_heads, D] layout for out and gate
            const float inv = 1.0f / l[v];
            const float* av = acc + v * D;
            float* o = out + off;
            if (gate) {
              for (int64_t d = 0; d < D; ++d) o[d] = av[d] * inv * sigmoid(gate[off + d]);
            } else {
              for (int64_t d = 0; d < D; ++d) o[d] = av[d] * inv;
            }
          }
        }
      },
      grain);
}

}  // namespace cpu
}  // namespace pe
