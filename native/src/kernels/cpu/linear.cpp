// linear: out[n, rows] = x[n, cols] * W^T with W [rows, cols] (F32, F16, BF16, FP8 e4m3 with
// block scales), fp32 accumulation.
//
// Work is split into tiles of (a block of R weight rows) x (a range of tokens). A task converts
// its R rows to fp32 once into a thread-local scratch (F32 weights are read in place) and then
// dots them with every token of its range through a register-tiled micro-kernel (NR rows x NT
// tokens of 8-float vectors). R is chosen so the converted block stays in L2. Decode (n = 1..8)
// parallelizes over row blocks only; prefill also splits tokens when there are few row blocks.
// Nothing is fused: the caller applies activations/residuals.
#include <algorithm>
#include <cstring>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float hsum(v8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// res[r * 4 + t] = dot(w[r], x[t]) for NR rows and NT tokens.
template <int NR, int NT>
void micro(const float* const* w, const float* const* x, int64_t cols, float* res) {
  v8 acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = v8{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    v8 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load8(w[r] + j);
    for (int t = 0; t < NT; ++t) {
      const v8 xv = load8(x[t] + j);
      for (int r = 0; r < NR; ++r) acc[r][t] += wv[r] * xv;
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t jj = j; jj < cols; ++jj) s += w[r][jj] * x[t][jj];
      res[r * 4 + t] = s;
    }
}

using MicroFn = void (*)(const float* const*, const float* const*, int64_t, float*);

MicroFn pick(int nr, int nt) {
  static const MicroFn table[4][4] = {
      {micro<1, 1>, micro<1, 2>, micro<1, 3>, micro<1, 4>},
      {micro<2, 1>, micro<2, 2>, micro<2, 3>, micro<2, 4>},
      {micro<3, 1>, micro<3, 2>, micro<3, 3>, micro<3, 4>},
      {micro<4, 1>, micro<4, 2>, micro<4, 3>, micro<4, 4>},
  };
  return table[nr - 1][nt - 1];
}

// Dots rows wb[0 .. n_rows) (fp32, row stride cols) with tokens [t0, t1) of x.
void tile(const float* wb, int64_t row0, int64_t n_rows, const float* x, int64_t t0, int64_t t1,
          int64_t cols, int64_t out_stride, float* out) {
  float res[16];
  for (int64_t t = t0; t < t1; t += 4) {
    const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
    const float* xs[4];
    for (int i = 0; i < nt; ++i) xs[i] = x + (t + i) * cols;
    // Fewer tokens -> more rows per call, so enough independent FMA chains stay in flight.
    const int nr_max = nt <= 2 ? 4 : 2;
    for (int64_t r = 0; r < n_rows; r += nr_max) {
      const int nr = static_cast<int>(std::min<int64_t>(nr_max, n_rows - r));
      const float* ws[4];
      for (int i = 0; i < nr; ++i) ws[i] = wb + (r + i) * cols;
      pick(nr, nt)(ws, xs, cols, res);
      for (int i = 0; i < nr; ++i)
        for (int k = 0; k < nt; ++k) out[(t + k) * out_stride + row0 + r + i] = res[i * 4 + k];
    }
  }
}

}  // namespace

void linear(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, cols = w.cols;
  if (n <= 0 || rows <= 0) return;
  if (cols <= 0) {
    std::fill(out, out + n * rows, 0.0f);
    return;
  }
  const int64_t threads = num_threads();
  // Rows per block: the converted block fits in ~192 KiB, and there are enough blocks to share.
  int64_t R = std::clamp<int64_t>((192 * 1024) / (cols * 4), 4, 64);
  R = std::min(R, std::max<int64_t>(4, (rows + 4 * threads - 1) / (4 * threads)));
  const int64_t row_blocks = (rows + R - 1) / R;
  const int64_t tok_groups = (n + 3) / 4;
  int64_t tok_splits = 1;
  if (row_blocks < 2 * threads && tok_groups > 1)
    tok_splits = std::min(tok_groups, (2 * threads + row_blocks - 1) / row_blocks);
  const int64_t tasks = row_blocks * tok_splits;
  const int64_t macs_per_task = R * cols * std::max<int64_t>(1, n / tok_splits);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / macs_per_task);
  const bool in_place = w.dtype == DType::F32;

  parallel_for(
      tasks,
      [&](int64_t begin, int64_t end) {
        float* wbuf = in_place ? nullptr : scratch(0, static_cast<size_t>(R * cols));
        int64_t converted = -1;  // row block currently in wbuf
        for (int64_t task = begin; task < end; ++task) {
          const int64_t rb = task / tok_splits, ts = task % tok_splits;
          const int64_t row0 = rb * R, nr = std::min(R, rows - row0);
          const float* wb;
          if (in_place) {
            wb = static_cast<const float*>(w.data) + row0 * cols;
          } else {
            if (converted != rb) weight_rows_to_f32(w, row0, nr, wbuf);
            converted = rb;
            wb = wbuf;
          }
          // Token range of this split, in whole groups of 4.
          const int64_t g0 = tok_groups * ts / tok_splits, g1 = tok_groups * (ts + 1) / tok_splits;
          tile(wb, row0, nr, x, g0 * 4, std::min(n, g1 * 4), cols, rows, out);
        }
      },
      grain);
}

}  // namespace cpu
}  // namespace pe
