// Paged KV cache write and causal GQA attention over it.
//
// Cache layout (PagedKV): k, v [n_pages, page_size, n_kv_heads] rows of head_dim values stored in
// one of the formats of kv_codec.h (F32, F16, BF16, FP8_E4M3, I8 + scale, NVFP4 + scales); token
// t of a sequence is row t % page_size of page page_table[t / page_size].
// kv_write: k, v [n, n_kv_heads, head_dim] fp32 -> the cache rows of positions start_pos + i.
// attention_paged: for query i (position P = q_start_pos + i) and head h (kv head h / group):
//   s_t = scale * q.k_t for t = 0 .. P; p = softmax(s) (fp32, max-subtracted);
//   o = sum_t p_t v_t; o *= sigmoid(gate) when gate is given (fused output gate).
// Flash-style: keys in tiles of kKeyTile with an online (running max) softmax, so memory does not
// grow with the context. A task holds a block of queries x the heads of one KV group: each K/V row
// is loaded (and converted) once per task and reused by all its query vectors. Parallel over
// tasks; blocks shrink for decode so every thread gets work. Two ways to compute a tile:
// - tiled (prefill, >= 8 query vectors per task): both products are small GEMMs whose vector
//   operand runs across the task's query vectors (attention_tiled.cpp); the softmax is vectorized
//   across them too. No horizontal sums, and the cache rows are used as they are stored.
// - dot (decode, fewer vectors): scores from a register-tiled 4 keys x 4 queries dot kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/threadpool.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {

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

namespace {

constexpr int64_t kDotMaxVecs = 64;  // query vectors per task of the dot path (QB * HB)

// The dot path: tasks of (kv head, block of QB queries, block of HB heads of its group).
void attention_dot(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads, const PagedKV& kv,
                   const int32_t* page_table, float scale, const float* gate, float* out, int64_t QB,
                   int64_t HB) {
  const KvRowFormat fmt = kv_row_format(kv.dtype, kv.head_dim);
  const int64_t D = kv.head_dim, Hkv = kv.n_kv_heads;
  const int64_t group = n_heads / Hkv;
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
        const float* qv[kDotMaxVecs];
        int64_t qpos[kDotMaxVecs];
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
            tile_rows(kv, fmt, page_table, g, t0, kt, n_keys, kvbuf, kp, vp);
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

}  // namespace

void attention_paged(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads,
                     const PagedKV& kv, const int32_t* page_table, float scale, const float* gate,
                     float* out) {
  kv_row_format(kv.dtype, kv.head_dim);  // throws for a dtype the cache cannot hold
  if (n_q <= 0) return;
  if (kv.n_kv_heads <= 0 || n_heads % kv.n_kv_heads != 0)
    throw std::invalid_argument("attention_paged: n_heads must be a multiple of n_kv_heads");
  const int64_t Hkv = kv.n_kv_heads, group = n_heads / Hkv;
  // Query blocks shrink until there are two tasks per thread. Tiled: blocks of all the group's
  // heads, ~96 query vectors (twelve vectors of 8: fewer passes over the cache than 48, buffers
  // still in L2); it needs at least 8.
  const int64_t threads = num_threads();
  int64_t QB = std::clamp<int64_t>(96 / group, 1, n_q);
  while (QB > 1 && Hkv * ((n_q + QB - 1) / QB) < 2 * threads) QB = (QB + 1) / 2;
  if (QB * group >= 8) return attention_tiled(q, n_q, q_start_pos, n_heads, kv, page_table, scale, gate, out, QB);
  // Dot: up to 16 queries x 8 heads, heads split too when there are still too few tasks.
  int64_t HB = std::min<int64_t>(group, 8);
  QB = std::min<int64_t>(16, kDotMaxVecs / HB);
  auto n_tasks = [&] { return Hkv * ((n_q + QB - 1) / QB) * ((group + HB - 1) / HB); };
  while (QB > 1 && n_tasks() < 2 * threads) QB /= 2;
  while (HB > 1 && n_tasks() < 2 * threads) HB = (HB + 1) / 2;
  attention_dot(q, n_q, q_start_pos, n_heads, kv, page_table, scale, gate, out, QB, HB);
}

}  // namespace cpu
}  // namespace pe
