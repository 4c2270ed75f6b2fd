// linear: out[n, rows] = x[n, cols] * W^T with W [rows, cols] (F32, F16, BF16, FP8 e4m3 with
// block scales, I8 with row scales, NVFP4 with group + global scales: ops.h), fp32 accumulation.
//
// Prefill (n > 16; n > 4 for F32/FP8 weights): a packed GEMM. A task owns a block of RB weight
// rows and a range of tokens; it converts the block to fp32 once (thread-local scratch) into
// K-major panels of 16 rows (panel[k][0..16), 8x8 register transposes), then runs a
// register-blocked micro-kernel: 6 tokens x 16 outputs = 12 ymm accumulators; per k two panel
// loads, six broadcasts of x and twelve FMAs. The panel block (RB x K floats) stays in L2, six
// token rows (6 x K) in L1.
// Decode (n <= 16) with 16-bit weights: a GEMV that streams each weight once (token groups of 4
// re-read a row tile from L1), 16 columns per 32-byte load widened in registers: BF16 lanes split
// into even/odd halves with one shift and one mask (x is pre-split the same way, once per call),
// F16 through F16C; software prefetch two row tiles ahead (rows are too short for the hardware
// prefetcher). F32, FP8, I8 and NVFP4 decode (n <= 4) use the row-tiled dot path (quantized rows
// converted to fp32 in scratch first: the same dequantization as the GEMM's panels). Chunks
// carry a minimum of work (constants below), so small calls stay on one thread. Nothing else is fused: the caller applies activations/residuals.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#if defined(__F16C__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

// Scratch slots of this file (other kernels use the low ones; linear may run nested in them).
constexpr int kSlotW = 4, kSlotPanel = 5, kSlotX = 6;

// 16-bit weights with at most this many tokens take the GEMV path (no packing).
constexpr int64_t kGemvMaxTokens = 16;

// Minimum work per parallel chunk: below this a job is not worth waking a second thread.
constexpr int64_t kGemvBytesPerChunk = 32 * 1024;   // decode: weight bytes streamed
constexpr int64_t kGemmMacsPerChunk = 1 << 20;      // prefill: multiply-adds

// Rows [row0, row0 + nr) of w as fp32. I8 and NVFP4 are decoded here (the reference
// dequantization of ops.h: int8 * row_scale, e2m1 * fp8(group_scale) * global_scale); the other
// formats go through the decoder shared with embedding.
void rows_to_f32(const WeightView& w, int64_t row0, int64_t nr, float* dst) {
  const int64_t cols = w.cols;
  if (w.dtype == DType::I8) {
    const int8_t* src = static_cast<const int8_t*>(w.data);
    for (int64_t r = 0; r < nr; ++r) {
      const float s = w.row_scale[row0 + r];
      const int8_t* q = src + (row0 + r) * cols;
      for (int64_t j = 0; j < cols; ++j) dst[r * cols + j] = static_cast<float>(q[j]) * s;
    }
  } else if (w.dtype == DType::NVFP4) {
    const uint8_t* src = static_cast<const uint8_t*>(w.data);
    for (int64_t r = 0; r < nr; ++r) {
      const uint8_t* q = src + (row0 + r) * (cols / 2);
      const uint8_t* gs = w.group_scale + (row0 + r) * (cols / 16);
      float* d = dst + r * cols;
      for (int64_t g = 0; g < cols / 16; ++g) {
        const float s = fp8e4m3_to_f32(gs[g]) * w.global_scale;
        for (int64_t j = 16 * g; j < 16 * g + 16; ++j)
          d[j] = fp4e2m1_to_f32((q[j / 2] >> ((j & 1) * 4)) & 0xf) * s;
      }
    }
  } else {
    weight_rows_to_f32(w, row0, nr, dst);
  }
}

// ---------------------------------------------------------------------------------------------
// Decode: F32 / FP8 rows (fp32 in memory or scratch) dotted with up to 4 tokens.
void tile(const float* wb, int64_t row0, int64_t n_rows, const float* x, int64_t t0, int64_t t1,
          int64_t cols, int64_t out_stride, float* out) {
  float res[16];
  for (int64_t t = t0; t < t1; t += 4) {
    const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
    const float* xs[4];
    for (int i = 0; i < nt; ++i) xs[i] = x + (t + i) * cols;
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

void linear_rows_decode(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, cols = w.cols;
  const bool in_place = w.dtype == DType::F32;
  const int64_t R = 16;
  const int64_t blocks = (rows + R - 1) / R;
  const int64_t bytes_per_block =
      std::max<int64_t>(1, static_cast<int64_t>(dtype_bytes_for(w.dtype, R * cols)));
  parallel_for(
      blocks,
      [&](int64_t begin, int64_t end) {
        float* wbuf = in_place ? nullptr : scratch(kSlotW, static_cast<size_t>(R * cols));
        for (int64_t b = begin; b < end; ++b) {
          const int64_t row0 = b * R, nr = std::min(R, rows - row0);
          const float* wb = static_cast<const float*>(w.data) + row0 * cols;
          if (!in_place) {
            rows_to_f32(w, row0, nr, wbuf);
            wb = wbuf;
          }
          tile(wb, row0, nr, x, 0, n, cols, rows, out);
        }
      },
      std::max<int64_t>(1, kGemvBytesPerChunk / bytes_per_block));
}

// ---------------------------------------------------------------------------------------------
// Decode: 16-bit weights, GEMV streaming. A 16-column block of a row widens to two v8f (a, b);
// x is stored per block as [8 floats matching a][8 matching b].
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef uint32_t v8u32 __attribute__((vector_size(32)));

template <DType DT>
inline void widen16(const uint16_t* p, v8f& a, v8f& b) {
  if constexpr (DT == DType::BF16) {
    v8u32 u;
    std::memcpy(&u, p, sizeof(u));
    const v8u32 lo = u << 16, hi = u & 0xffff0000u;  // even / odd elements as fp32
    std::memcpy(&a, &lo, sizeof(a));
    std::memcpy(&b, &hi, sizeof(b));
  } else {
#if defined(__F16C__)
    const __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    std::memcpy(&a, &va, sizeof(a));
    std::memcpy(&b, &vb, sizeof(b));
#else
    for (int l = 0; l < 8; ++l) a[l] = f16_to_f32(p[l]), b[l] = f16_to_f32(p[8 + l]);
#endif
  }
}

template <DType DT>
inline float w16_to_f32(uint16_t v) {
  return DT == DType::BF16 ? bf16_to_f32(v) : f16_to_f32(v);
}

// res[r * 4 + t] = dot(w[r], x[t]) for NR rows and NT tokens; xp[t] is x[t] in block layout
// for the first cols & ~15 columns, the tail comes from x[t].
template <DType DT, int NR, int NT>
void gemv_tile(const uint16_t* const* w, const float* const* xp, const float* const* x,
               int64_t cols, int64_t pf, float* res) {
  constexpr int S = NR * NT <= 4 ? 2 : 1;  // separate a/b accumulators: 8 FMA chains in flight
  v8f acc[NR][NT][S];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t)
      for (int s = 0; s < S; ++s) acc[r][t][s] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t c16 = cols & ~int64_t{15};
  for (int64_t j = 0; j < c16; j += 16) {
    v8f wa[NR], wb[NR];
    for (int r = 0; r < NR; ++r) {
      __builtin_prefetch(w[r] + j + pf);  // the rows of a later tile: short rows defeat the HW
      widen16<DT>(w[r] + j, wa[r], wb[r]);
    }
    for (int t = 0; t < NT; ++t) {
      const v8f xa = load8(xp[t] + j), xb = load8(xp[t] + j + 8);
      for (int r = 0; r < NR; ++r) {
        acc[r][t][0] += wa[r] * xa;
        acc[r][t][S - 1] += wb[r] * xb;
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = hsum8(S == 2 ? acc[r][t][0] + acc[r][t][S - 1] : acc[r][t][0]);
      for (int64_t jj = c16; jj < cols; ++jj) s += w16_to_f32<DT>(w[r][jj]) * x[t][jj];
      res[r * 4 + t] = s;
    }
}
#pragma GCC diagnostic pop

using GemvFn = void (*)(const uint16_t* const*, const float* const*, const float* const*, int64_t,
                        int64_t, float*);

template <DType DT>
GemvFn gemv_fn(int nr, int nt) {  // nr 1..4 (nt <= 2) or 1..2 (nt 3..4)
  static const GemvFn table[4][4] = {
      {gemv_tile<DT, 1, 1>, gemv_tile<DT, 1, 2>, gemv_tile<DT, 1, 3>, gemv_tile<DT, 1, 4>},
      {gemv_tile<DT, 2, 1>, gemv_tile<DT, 2, 2>, gemv_tile<DT, 2, 3>, gemv_tile<DT, 2, 4>},
      {gemv_tile<DT, 3, 1>, gemv_tile<DT, 3, 2>, nullptr, nullptr},
      {gemv_tile<DT, 4, 1>, gemv_tile<DT, 4, 2>, nullptr, nullptr},
  };
  return table[nr - 1][nt - 1];
}

template <DType DT>
void linear_w16_decode(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, cols = w.cols;
  const uint16_t* data = static_cast<const uint16_t*>(w.data);
  const int64_t c16 = cols & ~int64_t{15};
  const float* xs[kGemvMaxTokens];
  const float* xps[kGemvMaxTokens];
  float* xsplit = DT == DType::BF16 ? scratch(kSlotX, static_cast<size_t>(n * c16 + 1)) : nullptr;
  for (int64_t t = 0; t < n; ++t) {
    xs[t] = x + t * cols;
    xps[t] = xs[t];
    if (DT != DType::BF16) continue;
    float* d = xsplit + t * c16;  // per 16-block: even elements, then odd ones
    for (int64_t j = 0; j < c16; j += 16)
      for (int l = 0; l < 8; ++l) d[j + l] = xs[t][j + 2 * l], d[j + 8 + l] = xs[t][j + 2 * l + 1];
    xps[t] = d;
  }
  const int64_t G = n <= 2 ? 4 : 2;  // rows per micro-tile
  const int64_t groups = (rows + G - 1) / G;
  const int64_t pf = std::max<int64_t>(8 * G * cols, 1024);  // prefetch distance (elements)
  parallel_for(
      groups,
      [&](int64_t begin, int64_t end) {
        float res[16];
        for (int64_t gi = begin; gi < end; ++gi) {
          const int64_t r0 = gi * G;
          const int nr = static_cast<int>(std::min<int64_t>(G, rows - r0));
          const uint16_t* ws[4];
          for (int i = 0; i < nr; ++i) ws[i] = data + (r0 + i) * cols;
          for (int64_t t0 = 0; t0 < n; t0 += 4) {  // later token groups re-read the rows from L1
            const int nt = static_cast<int>(std::min<int64_t>(4, n - t0));
            gemv_fn<DT>(nr, nt)(ws, xps + t0, xs + t0, cols, pf, res);
            for (int i = 0; i < nr; ++i)
              for (int k = 0; k < nt; ++k) out[(t0 + k) * rows + r0 + i] = res[i * 4 + k];
          }
        }
      },
      std::max<int64_t>(1, kGemvBytesPerChunk / (G * cols * 2)));
}

// ---------------------------------------------------------------------------------------------
// Prefill: packed GEMM.
constexpr int kMT = 6;   // tokens per micro-tile
constexpr int kNC = 16;  // outputs (weight rows) per micro-tile = panel width

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
// out[t * ldo + c] = sum_k x[t * ldx + k] * panel[k * 16 + c] for t < MT, c < nc (<= 16).
template <int MT>
void gemm_micro(const float* panel, const float* x, int64_t ldx, int64_t K, float* out,
                int64_t ldo, int nc) {
  v8f acc[MT][2];
  for (int t = 0; t < MT; ++t) acc[t][0] = acc[t][1] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  const float* xr[MT];
  for (int t = 0; t < MT; ++t) xr[t] = x + t * ldx;
  for (int64_t k = 0; k < K; ++k) {
    const v8f b0 = load8(panel + k * kNC), b1 = load8(panel + k * kNC + 8);
    for (int t = 0; t < MT; ++t) {
      const float v = xr[t][k];
      const v8f a = {v, v, v, v, v, v, v, v};  // vbroadcastss
      acc[t][0] += a * b0;
      acc[t][1] += a * b1;
    }
  }
  for (int t = 0; t < MT; ++t) {
    float* o = out + t * ldo;
    if (nc == kNC) {
      store8(o, acc[t][0]);
      store8(o + 8, acc[t][1]);
    } else {
      float tmp[kNC];
      store8(tmp, acc[t][0]);
      store8(tmp + 8, acc[t][1]);
      std::memcpy(o, tmp, sizeof(float) * nc);
    }
  }
}
#pragma GCC diagnostic pop

using MicroFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t, int);
const MicroFn kMicro[kMT + 1] = {nullptr,         gemm_micro<1>, gemm_micro<2>, gemm_micro<3>,
                                 gemm_micro<4>,   gemm_micro<5>, gemm_micro<6>};

#if defined(__AVX__)
// dst[i * ldd + j] = src[j * lds + i] for i, j < 8.
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int j = 0; j < 2; ++j) {
      r[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0x44);
      r[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0xee);
    }
  // r[0]: cols 0,4 of rows 0-3 ... r[4..7] the same for rows 4-7.
  const int order[4] = {0, 2, 1, 3};  // r index holding output rows (0,4), (1,5), (2,6), (3,7)
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_ps(dst + q * ldd, _mm256_permute2f128_ps(r[order[q]], r[order[q] + 4], 0x20));
    _mm256_storeu_ps(dst + (q + 4) * ldd,
                     _mm256_permute2f128_ps(r[order[q]], r[order[q] + 4], 0x31));
  }
}
#endif

// Rows [row0, row0 + nr) of w as fp32 K-major panels of 16 rows (zero padded):
// panel[(s * K + k) * 16 + c] = W[row0 + 16 s + c][k].
void pack_panels(const WeightView& w, int64_t row0, int64_t nr, float* panel) {
  const int64_t K = w.cols;
  const float* src;
  if (w.dtype == DType::F32) {
    src = static_cast<const float*>(w.data) + row0 * K;
  } else {
    float* tmp = scratch(kSlotW, static_cast<size_t>(nr * K));
    rows_to_f32(w, row0, nr, tmp);
    src = tmp;
  }
  for (int64_t s = 0; s * kNC < nr; ++s) {
    const int64_t nc = std::min<int64_t>(kNC, nr - s * kNC);
    float* p = panel + s * K * kNC;
    const float* rs = src + s * kNC * K;
#if defined(__AVX__)
    if (nc == kNC) {  // full strip: 8x8 register transposes
      const int64_t k8 = K & ~int64_t{7};
      for (int64_t k = 0; k < k8; k += 8)
        for (int h = 0; h < 2; ++h) transpose8x8(rs + h * 8 * K + k, K, p + k * kNC + h * 8, kNC);
      for (int64_t c = 0; c < kNC; ++c)
        for (int64_t k = k8; k < K; ++k) p[k * kNC + c] = rs[c * K + k];
      continue;
    }
#endif
    for (int64_t k0 = 0; k0 < K; k0 += 64) {  // 64 x 16 sub-blocks: both sides stay in L1
      const int64_t k1 = std::min(K, k0 + 64);
      for (int64_t c = 0; c < nc; ++c)
        for (int64_t k = k0; k < k1; ++k) p[k * kNC + c] = rs[c * K + k];
      for (int64_t c = nc; c < kNC; ++c)
        for (int64_t k = k0; k < k1; ++k) p[k * kNC + c] = 0.0f;
    }
  }
}

void linear_gemm(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, K = w.cols;
  const int64_t threads = num_threads();
  // Rows per block: the packed block (RB x K floats) fits in ~256 KiB of L2.
  int64_t RB = std::clamp<int64_t>((256 * 1024 / 4) / (K * kNC), 1, 4) * kNC;
  RB = std::min(RB, (rows + kNC - 1) / kNC * kNC);
  const int64_t row_blocks = (rows + RB - 1) / RB;
  // Split tokens (in whole micro-tiles) until there are ~4 tasks per thread to rebalance.
  const int64_t tok_tiles = (n + kMT - 1) / kMT;
  int64_t tok_splits = 1;
  if (row_blocks < 4 * threads)
    tok_splits = std::min(tok_tiles, (4 * threads + row_blocks - 1) / row_blocks);
  const int64_t tasks = row_blocks * tok_splits;
  const int64_t macs_per_task = RB * K * std::max<int64_t>(1, n / tok_splits);
  const int64_t grain = std::max<int64_t>(1, kGemmMacsPerChunk / macs_per_task);

  parallel_for(
      tasks,
      [&](int64_t begin, int64_t end) {
        float* panel = scratch(kSlotPanel, static_cast<size_t>(RB * K));
        int64_t packed = -1;  // row block currently in panel
        for (int64_t task = begin; task < end; ++task) {
          const int64_t rb = task / tok_splits, ts = task % tok_splits;
          const int64_t row0 = rb * RB, nr = std::min(RB, rows - row0);
          if (packed != rb) pack_panels(w, row0, nr, panel);
          packed = rb;
          const int64_t t0 = tok_tiles * ts / tok_splits * kMT;
          const int64_t t1 = std::min(n, tok_tiles * (ts + 1) / tok_splits * kMT);
          for (int64_t t = t0; t < t1; t += kMT) {
            const int mt = static_cast<int>(std::min<int64_t>(kMT, t1 - t));
            for (int64_t s = 0; s * kNC < nr; ++s)
              kMicro[mt](panel + s * K * kNC, x + t * K, K, K, out + t * rows + row0 + s * kNC,
                         rows, static_cast<int>(std::min<int64_t>(kNC, nr - s * kNC)));
          }
        }
      },
      grain);
}

}  // namespace

void linear(const float* x, int64_t n, const WeightView& w, float* out) {
  const int64_t rows = w.rows, cols = w.cols;
  if (n <= 0 || rows <= 0) return;
  if (cols <= 0) {
    std::fill(out, out + n * rows, 0.0f);
    return;
  }
  if (w.dtype == DType::I8 && !w.row_scale)
    throw std::invalid_argument("cpu::linear: I8 weight without row scales");
  if (w.dtype == DType::NVFP4 && (!w.group_scale || cols % 16 != 0))
    throw std::invalid_argument("cpu::linear: NVFP4 weight needs group scales and cols % 16 == 0");
  const bool w16 = w.dtype == DType::BF16 || w.dtype == DType::F16;
  if (n > (w16 ? kGemvMaxTokens : 4)) return linear_gemm(x, n, w, out);
  if (w.dtype == DType::BF16) return linear_w16_decode<DType::BF16>(x, n, w, out);
  if (w.dtype == DType::F16) return linear_w16_decode<DType::F16>(x, n, w, out);
  linear_rows_decode(x, n, w, out);
}

void fp8_group_quantize(const float* x, int64_t n, int64_t cols, float* out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const float* xr = x + t * cols;
      const int64_t c1 = std::min(c0 + 128, cols);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(xr[c]));
      const float s = std::max(amax, 1e-10f) / 448.0f;
      for (int64_t c = c0; c < c1; ++c) out[t * cols + c] = fp8e4m3_to_f32(f32_to_fp8e4m3(xr[c] / s)) * s;
    }
}

}  // namespace cpu
}  // namespace pe
