// linear: out[n, rows] = x[n, cols] * W^T with W [rows, cols] (F32, F16, BF16, FP8 e4m3 with
// block scales), fp32 accumulation.
//
// Work is split into tiles of (a block of R weight rows) x (a range of tokens). A task converts
// its R rows to fp32 once into a thread-local scratch (F32 weights are read in place) and then
// dots them with every token of its range through a register-tiled micro-kernel (NR rows x NT
// tokens of 8-float vectors). R is chosen so the converted block stays in L2. Decode (n = 1..8)
// parallelizes over row blocks only; prefill also splits tokens when there are few row blocks.
// Decode with 16-bit weights (n <= 4) skips the scratch: the micro-kernel widens BF16/F16 vectors
// in registers right before the FMAs, so weights stream from memory exactly once.
// Nothing else is fused: the caller applies activations/residuals.
#include <algorithm>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

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
      dot_tile_fn(nr, nt)(ws, xs, cols, res);
      for (int i = 0; i < nr; ++i)
        for (int k = 0; k < nt; ++k) out[(t + k) * out_stride + row0 + r + i] = res[i * 4 + k];
    }
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

template <DType DT>
inline v8f load_w8(const uint16_t* p) {
  v8f f;
  if constexpr (DT == DType::BF16) {
    v8u16 h;
    std::memcpy(&h, p, sizeof(h));
    const v8u32 u = __builtin_convertvector(h, v8u32) << 16;
    std::memcpy(&f, &u, sizeof(f));
  } else {
#if defined(__F16C__)
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    std::memcpy(&f, &v, sizeof(f));
#else
    for (int l = 0; l < 8; ++l) f[l] = f16_to_f32(p[l]);
#endif
  }
  return f;
}

template <DType DT>
inline float w16_to_f32(uint16_t v) {
  return DT == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
}

// dot_tile with 16-bit weight rows w[r] widened in registers.
template <DType DT, int NR, int NT>
void dot_tile_w16(const uint16_t* const* w, const float* const* x, int64_t cols, float* res) {
  v8f acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    v8f wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_w8<DT>(w[r] + j);
    for (int t = 0; t < NT; ++t) {
      const v8f xv = load8(x[t] + j);
      for (int r = 0; r < NR; ++r) acc[r][t] += wv[r] * xv;
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = hsum8(acc[r][t]);
      for (int64_t jj = j; jj < cols; ++jj) s += w16_to_f32<DT>(w[r][jj]) * x[t][jj];
      res[r * 4 + t] = s;
    }
}
#pragma GCC diagnostic pop

using W16TileFn = void (*)(const uint16_t* const*, const float* const*, int64_t, float*);

template <DType DT>
W16TileFn w16_tile_fn(int nr, int nt) {
  static const W16TileFn table[4][4] = {
      {dot_tile_w16<DT, 1, 1>, dot_tile_w16<DT, 1, 2>, dot_tile_w16<DT, 1, 3>, dot_tile_w16<DT, 1, 4>},
      {dot_tile_w16<DT, 2, 1>, dot_tile_w16<DT, 2, 2>, dot_tile_w16<DT, 2, 3>, dot_tile_w16<DT, 2, 4>},
      {dot_tile_w16<DT, 3, 1>, dot_tile_w16<DT, 3, 2>, dot_tile_w16<DT, 3, 3>, dot_tile_w16<DT, 3, 4>},
      {dot_tile_w16<DT, 4, 1>, dot_tile_w16<DT, 4, 2>, dot_tile_w16<DT, 4, 3>, dot_tile_w16<DT, 4, 4>},
  };
  return table[nr - 1][nt - 1];
}

// Decode path for BF16/F16 weights and n <= 4 tokens: rows in groups of 4, no scratch.
void linear_w16_decode(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, cols = w.cols;
  const uint16_t* data = static_cast<const uint16_t*>(w.data);
  const float* xs[4];
  for (int64_t t = 0; t < n; ++t) xs[t] = x + t * cols;
  const int nt = static_cast<int>(n);
  const int64_t groups = (rows + 3) / 4;
  parallel_for(
      groups,
      [&](int64_t begin, int64_t end) {
        float res[16];
        for (int64_t gi = begin; gi < end; ++gi) {
          const int64_t r0 = gi * 4;
          const int nr = static_cast<int>(std::min<int64_t>(4, rows - r0));
          const uint16_t* ws[4];
          for (int i = 0; i < nr; ++i) ws[i] = data + (r0 + i) * cols;
          (w.dtype == DType::BF16 ? w16_tile_fn<DType::BF16>(nr, nt)
                                  : w16_tile_fn<DType::F16>(nr, nt))(ws, xs, cols, res);
          for (int i = 0; i < nr; ++i)
            for (int k = 0; k < nt; ++k) out[k * rows + r0 + i] = res[i * 4 + k];
        }
      },
      std::max<int64_t>(1, (int64_t{1} << 16) / (4 * cols * n)));
}

}  // namespace

void linear(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, cols = w.cols;
  if (n <= 0 || rows <= 0) return;
  if (cols <= 0) {
    std::fill(out, out + n * rows, 0.0f);
    return;
  }
  if ((w.dtype == DType::BF16 || w.dtype == DType::F16) && n <= 4)
    return linear_w16_decode(x, n, w, out);
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
