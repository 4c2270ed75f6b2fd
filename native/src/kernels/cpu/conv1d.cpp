// Causal depthwise conv1d + SiLU with a carried state (the GDN short convolution).
//
// x = [state (K-1 rows, oldest first); u (n rows, stride u_stride)], channels C, weights w [C, K]:
//   out[t, c] = silu(sum_{j<K} w[c, j] * x[t + j, c])           out [n, C] dense
//   state <- last K-1 rows of x (raw inputs, not convolved)
// Same code for a decode step (n = 1) and a prefill (n > 1), so both agree bit for bit.
// Parallel over blocks of 64 channels: each block transposes its weights to [K, 64] on the stack
// so the inner loop runs over contiguous channels; the state update is fused at the end.
#include <algorithm>
#include <stdexcept>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

constexpr int64_t kBlock = 64;
constexpr int64_t kMaxK = 16;

}  // namespace

void conv1d_causal(const float* u, int64_t n, int64_t u_stride, int64_t C, const float* w, int64_t K,
                   float* state, float* out) {
  if (K < 1 || K > kMaxK) throw std::invalid_argument("conv1d_causal: kernel width must be 1..16");
  if (n <= 0 || C <= 0) return;
  const int64_t S = K - 1;  // state rows
  const int64_t n_blocks = (C + kBlock - 1) / kBlock;
  // Row r of x = [state; u] for channel offset c0.
  auto x_row = [&](int64_t r, int64_t c0) -> const float* {
    return r < S ? state + r * C + c0 : u + (r - S) * u_stride + c0;
  };
  parallel_for(
      n_blocks,
      [&](int64_t begin, int64_t end) {
        float wt[kMaxK][kBlock];
        float acc[kBlock];
        for (int64_t b = begin; b < end; ++b) {
          const int64_t c0 = b * kBlock, nc = std::min(kBlock, C - c0);
          for (int64_t c = 0; c < nc; ++c)
            for (int64_t j = 0; j < K; ++j) wt[j][c] = w[(c0 + c) * K + j];
          for (int64_t t = 0; t < n; ++t) {
            std::fill(acc, acc + kBlock, 0.0f);
            for (int64_t j = 0; j < K; ++j) {
              const float* xr = x_row(t + j, c0);
              for (int64_t c = 0; c < nc; ++c) acc[c] += wt[j][c] * xr[c];
            }
            float* o = out + t * C + c0;
            for (int64_t c = 0; c < nc; ++c) o[c] = silu(acc[c]);
          }
          // New state row r = x row n + r. Reading row n + r >= r while writing row r in order is
          // safe in place (a source still in the state lies ahead of the destination).
          for (int64_t r = 0; r < S; ++r) {
            const float* src = x_row(n + r, c0);
            float* dst = state + r * C + c0;
            for (int64_t c = 0; c < nc; ++c) dst[c] = src[c];
          }
        }
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(n * K * kBlock, 1)));
}

}  // namespace cpu
}  // namespace pe
