// Partial NeoX rotary embedding, in place on x[n_tokens, n_heads, head_dim] (token stride given).
//
// For i < R/2 (R = rot_dim): inv_freq_i = 1 / theta^(2i/R), angle = pos * inv_freq_i,
//   y[i]       = x[i] cos - x[i + R/2] sin
//   y[i + R/2] = x[i + R/2] cos + x[i] sin
// dims >= R pass through. inv_freq and the angle are rounded to fp32 the way the reference
// (transformers, fp32 inv_freq times fp32 positions) does, then cos/sin are taken in double, so
// long positions match the reference's angles rather than more exact ones. cos/sin are computed
// once per token and shared by its heads. Parallel over tokens.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {

void rope_neox(float* x, int64_t n_tokens, int64_t token_stride, int64_t n_heads, int64_t head_dim,
               int64_t rot_dim, const int32_t* pos, float theta) {
  if (rot_dim <= 0 || n_tokens <= 0) return;
  if (rot_dim > head_dim || rot_dim % 2 != 0)
    throw std::invalid_argument("rope_neox: rot_dim must be even and <= head_dim");
  const int64_t half = rot_dim / 2;
  // inv_freq is the same for every token: computed once per call into the caller's scratch.
  float* inv_freq = scratch(0, static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    const float p = static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(e)));
    inv_freq[i] = 1.0f / p;
  }
  const float* inv = inv_freq;
  parallel_for(
      n_tokens,
      [&](int64_t begin, int64_t end) {
        float* cs = scratch(1, static_cast<size_t>(2 * half));
        float* sn = cs + half;
        for (int64_t t = begin; t < end; ++t) {
          const float p = static_cast<float>(pos[t]);
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(p * inv[i]);
            cs[i] = static_cast<float>(std::cos(angle));
            sn[i] = static_cast<float>(std::sin(angle));
          }
          float* xt = x + t * token_stride;
          for (int64_t h = 0; h < n_heads; ++h) {
            float* a = xt + h * head_dim;
            float* b = a + half;
            for (int64_t i = 0; i < half; ++i) {
              const float x0 = a[i], x1 = b[i];
              a[i] = x0 * cs[i] - x1 * sn[i];
              b[i] = x1 * cs[i] + x0 * sn[i];
            }
          }
        }
      },
      std::max<int64_t>(1, 8192 / std::max<int64_t>(n_heads * head_dim, 1)));
}

}  // namespace cpu
}  // namespace pe
