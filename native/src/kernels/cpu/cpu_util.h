// Helpers shared by the CPU kernels (internal to kernels/cpu/).
//
// Reductions are written with independent partial sums so that GCC/Clang vectorize them without
// -ffast-math (a plain `s += a[i] * b[i]` loop is a serial dependency the compiler must keep).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/ops.h"

namespace pe {
namespace cpu {

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {0};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[j + l] * b[j + l];
  for (; j < n; ++j) acc[j & 15] += a[j] * b[j];
  float s = 0.0f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

inline float sum_squares(const float* a, int64_t n) { return dot(a, a, n); }

// y[0..n) += alpha * x[0..n)
inline void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += alpha * x[j];
}

// max of x[0..n) (-inf for n == 0; NaN entries are skipped), in 8 vectorizable lanes.
inline float max_of(const float* x, int64_t n) {
  float m[8];
  for (int l = 0; l < 8; ++l) m[l] = -INFINITY;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) m[l] = m[l] < x[i + l] ? x[i + l] : m[l];
  for (; i < n; ++i) m[0] = m[0] < x[i] ? x[i] : m[0];
  float r = m[0];
  for (int l = 1; l < 8; ++l) r = r < m[l] ? m[l] : r;
  return r;
}

// exp(x) for x <= 0 (softmax weights), within ~2 ulp of expf: Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2/2, degree-7 Taylor for e^r, 2^n from the exponent bits. x < -87 (true value below
// 2^-125) and NaN give 0. The range tests are integer selects on the bits: a float compare-select
// would keep GCC from vectorizing loops over this function (trapping math).
inline float exp_nonpos(float x) {
  uint32_t ux;
  std::memcpy(&ux, &x, 4);
  const uint32_t kMinus87 = 0xc2ae0000u;  // bits of -87.0f; larger bits = more negative (or -NaN)
  const uint32_t zero = ((ux > kMinus87) | ((ux & 0x7fffffffu) > 0x7f800000u)) ? ~0u : 0u;
  const uint32_t uc = (ux & ~zero) | (kMinus87 & zero);
  float xc;
  std::memcpy(&xc, &uc, 4);
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t bits = (static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23) & ~zero;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// 8-float vectors (GCC/Clang vector extension; one AVX register, two SSE ones without AVX).
// Only used by inline functions inside one translation unit, so the psABI note does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8f __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

// v, held in a register from here on. For a loaded vector that feeds several FMAs: GCC would
// otherwise fold the load into each FMA (one load per FMA), which makes a register-tiled
// micro-kernel load-bound (measured 2x slower on Zen 4).
inline v8f in_register(v8f v) {
#if defined(__AVX__) && defined(__GNUC__)
  asm("" : "+v"(v));
#endif
  return v;
}

inline float hsum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Register-tiled dot products: res[r * 4 + t] = dot(a[r], b[t]) for NR rows of a and NT of b
// (NR, NT <= 4), each of length len. Each loaded vector feeds several FMAs.
template <int NR, int NT>
void dot_tile(const float* const* a, const float* const* b, int64_t len, float* res) {
  v8f acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    v8f av[NR];
    for (int r = 0; r < NR; ++r) av[r] = load8(a[r] + j);
    for (int t = 0; t < NT; ++t) {
      const v8f bv = load8(b[t] + j);
      for (int r = 0; r < NR; ++r) acc[r][t] += av[r] * bv;
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = hsum8(acc[r][t]);
      for (int64_t jj = j; jj < len; ++jj) s += a[r][jj] * b[t][jj];
      res[r * 4 + t] = s;
    }
}

using DotTileFn = void (*)(const float* const*, const float* const*, int64_t, float*);

// dot_tile<nr, nt> for run-time 1 <= nr, nt <= 4.
inline DotTileFn dot_tile_fn(int nr, int nt) {
  static const DotTileFn table[4][4] = {
      {dot_tile<1, 1>, dot_tile<1, 2>, dot_tile<1, 3>, dot_tile<1, 4>},
      {dot_tile<2, 1>, dot_tile<2, 2>, dot_tile<2, 3>, dot_tile<2, 4>},
      {dot_tile<3, 1>, dot_tile<3, 2>, dot_tile<3, 3>, dot_tile<3, 4>},
      {dot_tile<4, 1>, dot_tile<4, 2>, dot_tile<4, 3>, dot_tile<4, 4>},
  };
  return table[nr - 1][nt - 1];
}

// Small GEMM on row pointers: C[i, 0..N) = beta * C[i, :] + alpha * sum_k A[i * lda + k] * B(k)[0..N)
// for i < M, where B(k) returns row k of B (a pointer array or a strided matrix: any callable).
// beta == 0 overwrites C without reading it. Register tile: 4 rows x 16 columns (8 vectors); B
// rows are streamed once per 4 rows of C, with no stores inside the k loop.
template <typename BRow>
void gemm_rows(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, BRow B,
               float beta, float* C, int64_t ldc) {
  for (int64_t i0 = 0; i0 < M; i0 += 4) {
    const int mr = static_cast<int>(std::min<int64_t>(4, M - i0));
    int64_t j0 = 0;
    for (; j0 + 16 <= N; j0 += 16) {
      v8f acc[4][2];
      for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = v8f{0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = 0; k < K; ++k) {
        const float* b = B(k) + j0;
        const v8f b0 = load8(b), b1 = load8(b + 8);
        for (int r = 0; r < 4; ++r) {
          if (r >= mr) break;
          const float a = A[(i0 + r) * lda + k];
          acc[r][0] += a * b0;
          acc[r][1] += a * b1;
        }
      }
      for (int r = 0; r < mr; ++r) {
        float* c = C + (i0 + r) * ldc + j0;
        for (int h = 0; h < 2; ++h) {
          const v8f prev = beta == 0.0f ? v8f{0, 0, 0, 0, 0, 0, 0, 0} : load8(c + 8 * h) * beta;
          store8(c + 8 * h, prev + alpha * acc[r][h]);
        }
      }
    }
    for (; j0 < N; ++j0)  // leftover columns
      for (int r = 0; r < mr; ++r) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; ++k) sum += A[(i0 + r) * lda + k] * B(k)[j0];
        float* c = C + (i0 + r) * ldc + j0;
        *c = (beta == 0.0f ? 0.0f : beta * *c) + alpha * sum;
      }
  }
}
#pragma GCC diagnostic pop

// Thread-local scratch buffers, reused across calls (they only grow): slot s of the calling
// thread holds at least n floats. Distinct slots may be used at the same time.
inline float* scratch(int slot, size_t n) {
  thread_local std::vector<float> bufs[8];
  std::vector<float>& b = bufs[slot];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// Rows [row0, row0 + n_rows) of w converted to fp32 into dst [n_rows, w.cols] (FP8 block scales
// applied). Defined in embedding.cpp.
void weight_rows_to_f32(const WeightView& w, int64_t row0, int64_t n_rows, float* dst);

}  // namespace cpu
}  // namespace pe
