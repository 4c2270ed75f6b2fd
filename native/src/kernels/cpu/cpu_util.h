// Helpers shared by the CPU kernels (internal to kernels/cpu/).
//
// Reductions are written with independent partial sums so that GCC/Clang vectorize them without
// -ffast-math (a plain `s += a[i] * b[i]` loop is a serial dependency the compiler must keep).
#pragma once
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

// exp(x) for x <= 0 (softmax weights), within ~2 ulp of expf, branch-free so loops over it
// vectorize: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r, 2^n from
// the exponent bits. x < -87 gives 0 (the true value is below 2^-125).
inline float exp_nonpos(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
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
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.0f ? 0.0f : p * scale;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

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
