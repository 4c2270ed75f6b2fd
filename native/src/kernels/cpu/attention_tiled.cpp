// The tiled path of attention_paged (attention.cpp): tasks with many query vectors (prefill).
//
// A task is (kv head g, block of queries i0 .. i1) with all `group` heads of g: nv query vectors
// (v = (i - i0) * group + head in group), the columns of every buffer below, padded to nvp (a
// multiple of 8) with zero queries whose results are dropped:
//   qt  [D, nvp]         qt[d][v] = scale * q_v[d], transposed once per task
//   st  [kKeyTile, nvp]  st[j][v] = sum_d k_j[d] qt[d][v]; then the softmax weights, in place
//   acc [D, nvp]         acc[d][v] = sum_j w_j[v] v_j[d]: the unnormalized output, transposed
// Per tile of keys: the scores (micro-kernel of 4 keys x 24 columns: per d three qt loads, four
// broadcasts of k_j[d], twelve FMAs); -inf for keys after a query's position (only in tiles that
// reach past the block's first query); the online softmax down each column, vectorized across
// columns (running max m and sum l; acc rescaled by exp(m_old - m_new) when a max moves); then
// acc += V^T st with the same micro-kernel shape (4 dims x 24 columns, per key three st loads and
// four broadcasts of v_j[d]). Both products broadcast from the cache rows as they are stored, so
// the key loop needs no horizontal sums and no transposes. Finally out = acc^T / l, times
// sigmoid(gate) when given. For the default model (group 3, 32 queries: 96 columns, D 64) qt and
// acc take 24 KiB each and st 48 KiB: L2-resident, the micro-kernels' slices of them in L1.
#include <algorithm>
#include <cmath>

#include "core/threadpool.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/cpu_util.h"

namespace pe {
namespace cpu {
namespace {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
// st[r * ld + c] = sum_d kp[r][d] * qt[d * ld + c] for r < NR keys, c < 8 * NC columns;
// col_max[c] = max(col_max[c], st[r * ld + c] over r).
template <int NR, int NC>
void scores_tile(const float* const* kp, const float* qt, int64_t ld, int64_t D, float* st, float* col_max) {
  v8f acc[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t d = 0; d < D; ++d) {
    v8f b[NC];
    for (int c = 0; c < NC; ++c) b[c] = in_register(load8(qt + d * ld + 8 * c));
    for (int r = 0; r < NR; ++r) {
      const float a = kp[r][d];
      for (int c = 0; c < NC; ++c) acc[r][c] += a * b[c];
    }
  }
  for (int c = 0; c < NC; ++c) {
    v8f mx = load8(col_max + 8 * c);
    for (int r = 0; r < NR; ++r) {
      store8(st + r * ld + 8 * c, acc[r][c]);
      mx = mx < acc[r][c] ? acc[r][c] : mx;
    }
    store8(col_max + 8 * c, mx);
  }
}

// acc[r * ld + c] += sum_j vp[j][d0 + r] * st[j * ld + c] for r < NR dims, c < 8 * NC columns.
template <int NR, int NC>
void values_tile(const float* const* vp, int64_t d0, const float* st, int64_t ld, int64_t kt, float* acc) {
  v8f sum[NR][NC];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) sum[r][c] = load8(acc + r * ld + 8 * c);
  for (int64_t j = 0; j < kt; ++j) {
    v8f b[NC];
    for (int c = 0; c < NC; ++c) b[c] = in_register(load8(st + j * ld + 8 * c));
    const float* v = vp[j] + d0;
    for (int r = 0; r < NR; ++r) {
      const float a = v[r];
      for (int c = 0; c < NC; ++c) sum[r][c] += a * b[c];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) store8(acc + r * ld + 8 * c, sum[r][c]);
}
#pragma GCC diagnostic pop

constexpr int kRows = 4;  // micro-tile rows (keys, or dims of v)
constexpr int kVecs = 3;  // micro-tile columns in vectors of 8

using ScoresFn = void (*)(const float* const*, const float*, int64_t, int64_t, float*, float*);
using ValuesFn = void (*)(const float* const*, int64_t, const float*, int64_t, int64_t, float*);

template <int NR>
constexpr ScoresFn kScoresRow[kVecs] = {scores_tile<NR, 1>, scores_tile<NR, 2>, scores_tile<NR, 3>};
template <int NR>
constexpr ValuesFn kValuesRow[kVecs] = {values_tile<NR, 1>, values_tile<NR, 2>, values_tile<NR, 3>};
const ScoresFn* const kScores[kRows] = {kScoresRow<1>, kScoresRow<2>, kScoresRow<3>, kScoresRow<4>};
const ValuesFn* const kValues[kRows] = {kValuesRow<1>, kValuesRow<2>, kValuesRow<3>, kValuesRow<4>};

// st[j][0 .. nvp) for j < kt: scores of the tile's keys kp against qt; col_max their max per column.
void tile_scores(const float* const* kp, int64_t kt, const float* qt, int64_t nvp, int64_t D, float* st,
                 float* col_max) {
  std::fill(col_max, col_max + nvp, -INFINITY);
  for (int64_t c0 = 0; c0 < nvp; c0 += 8 * kVecs) {
    const int nc = static_cast<int>(std::min<int64_t>(kVecs, (nvp - c0) / 8));
    for (int64_t j0 = 0; j0 < kt; j0 += kRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kRows, kt - j0));
      kScores[nr - 1][nc - 1](kp + j0, qt + c0, nvp, D, st + j0 * nvp + c0, col_max + c0);
    }
  }
}

// acc[d][0 .. nvp) += sum_j vp[j][d] st[j][..] for d < D.
void tile_values(const float* const* vp, int64_t kt, const float* st, int64_t nvp, int64_t D, float* acc) {
  for (int64_t c0 = 0; c0 < nvp; c0 += 8 * kVecs) {
    const int nc = static_cast<int>(std::min<int64_t>(kVecs, (nvp - c0) / 8));
    for (int64_t d0 = 0; d0 < D; d0 += kRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kRows, D - d0));
      kValues[nr - 1][nc - 1](vp, d0, st + c0, nvp, kt, acc + d0 * nvp + c0);
    }
  }
}

// -inf for the keys of tile t0 .. t0 + kt that are in the future of some of the block's queries
// (positions first_pos + v / group); col_max becomes the max of what is left.
void mask_future(float* st, int64_t kt, int64_t nvp, int64_t nv, int64_t t0, int64_t first_pos, int64_t group,
                 float* col_max) {
  for (int64_t j = std::max<int64_t>(0, first_pos + 1 - t0); j < kt; ++j) {
    const int64_t v_end = std::min(nv, (t0 + j - first_pos) * group);  // queries before key t0 + j
    std::fill(st + j * nvp, st + j * nvp + v_end, -INFINITY);
  }
  std::fill(col_max, col_max + nvp, -INFINITY);
  for (int64_t j = 0; j < kt; ++j) {
    const float* s = st + j * nvp;
    for (int64_t v = 0; v < nvp; ++v) col_max[v] = col_max[v] < s[v] ? s[v] : col_max[v];
  }
}

// The online softmax step of one tile, down each column of st [kt, nvp] whose max is tile_max:
// m becomes the running max including this tile, st the weights exp(s - m), l the running sum
// (old sum * corr + the tile's). Returns whether any max moved; corr[v] = exp(m_old - m_new) is
// the factor of the old terms. Every loop runs across columns, so it vectorizes; masked scores
// (-inf) weigh 0.
bool softmax_tile(float* st, int64_t kt, int64_t nvp, float* m, float* l, float* corr, const float* tile_max) {
  bool moved = false;
  for (int64_t v = 0; v < nvp; ++v) {
    const float new_m = m[v] < tile_max[v] ? tile_max[v] : m[v];
    moved |= new_m != m[v];
    corr[v] = exp_nonpos(m[v] - new_m);  // 0 for the first tile (m = -inf)
    m[v] = new_m;
    l[v] *= corr[v];
  }
  for (int64_t j = 0; j < kt; ++j) {
    float* s = st + j * nvp;
    for (int64_t v = 0; v < nvp; ++v) {
      const float w = exp_nonpos(s[v] - m[v]);
      s[v] = w;
      l[v] += w;
    }
  }
  return moved;
}

}  // namespace

void attention_tiled(const float* q, int64_t n_q, int64_t q_start_pos, int64_t n_heads, const PagedKV& kv,
                     const int32_t* page_table, float scale, const float* gate, float* out, int64_t QB) {
  const KvRowFormat fmt = kv_row_format(kv.dtype, kv.head_dim);
  const int64_t D = kv.head_dim, Hkv = kv.n_kv_heads, group = n_heads / Hkv;
  const int64_t n_qb = (n_q + QB - 1) / QB;
  const int64_t max_nvp = (QB * group + 7) / 8 * 8;
  parallel_for(Hkv * n_qb, [&](int64_t begin, int64_t end) {
    float* qt = scratch(0, static_cast<size_t>(2 * D * max_nvp + (kKeyTile + 4) * max_nvp));
    float* acc = qt + D * max_nvp;
    float* st = acc + D * max_nvp;
    float* m = st + kKeyTile * max_nvp;
    float* l = m + max_nvp;
    float* corr = l + max_nvp;
    float* tile_max = corr + max_nvp;
    float* kvbuf = scratch(1, static_cast<size_t>(2 * kKeyTile * D));
    const float* kp[kKeyTile];
    const float* vp[kKeyTile];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / n_qb, i0 = task % n_qb * QB, i1 = std::min(n_q, i0 + QB);
      const int64_t nv = (i1 - i0) * group, nvp = (nv + 7) / 8 * 8;
      for (int64_t d = 0; d < D; ++d) std::fill(qt + d * nvp + nv, qt + (d + 1) * nvp, 0.0f);
      for (int64_t v = 0; v < nv; ++v) {
        const float* qv = q + ((i0 + v / group) * n_heads + g * group + v % group) * D;
        for (int64_t d = 0; d < D; ++d) qt[d * nvp + v] = scale * qv[d];
      }
      std::fill(acc, acc + D * nvp, 0.0f);
      std::fill(m, m + nvp, -INFINITY);
      std::fill(l, l + nvp, 0.0f);
      const int64_t first_pos = q_start_pos + i0, n_keys = q_start_pos + i1;
      for (int64_t t0 = 0; t0 < n_keys; t0 += kKeyTile) {
        const int64_t kt = std::min(kKeyTile, n_keys - t0);
        tile_rows(kv, fmt, page_table, g, t0, kt, n_keys, kvbuf, kp, vp);
        tile_scores(kp, kt, qt, nvp, D, st, tile_max);
        if (t0 + kt - 1 > first_pos) mask_future(st, kt, nvp, nv, t0, first_pos, group, tile_max);
        if (softmax_tile(st, kt, nvp, m, l, corr, tile_max))
          for (int64_t d = 0; d < D; ++d)
            for (int64_t v = 0; v < nvp; ++v) acc[d * nvp + v] *= corr[v];
        tile_values(vp, kt, st, nvp, D, acc);
      }
      for (int64_t v = 0; v < nv; ++v) {
        const int64_t off = ((i0 + v / group) * n_heads + g * group + v % group) * D;
        const float inv = 1.0f / l[v];
        for (int64_t d = 0; d < D; ++d) {
          const float o = acc[d * nvp + v] * inv;
          out[off + d] = gate ? o * sigmoid(gate[off + d]) : o;
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace pe
