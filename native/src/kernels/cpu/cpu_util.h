// Helpers shared by the CPU kernels (internal to kernels/cpu/).
//
// Reductions are written with independent partial sums so that GCC/Clang vectorize them without
// -ffast-math (a plain `s += a[i] * b[i]` loop is a serial dependency the compiler must keep).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
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
