// Causal depthwise conv1d + SiLU with a carried state (the GDN short convolution).
//
// u: n rows (stride u_stride) at positions pos0 .. pos0 + n - 1; state: a ring [K, C] whose row
// p % K holds the raw input of position p; channels C, weights w [C, K]:
//   x(p) = p >= pos0 ? u[p - pos0] : state[p mod K]
//   out[t, c] = silu(sum_{j<K} w[c, j] * x(pos0 + t - (K-1) + j)[c])    out [n, C] dense
//   state[p % K] <- u[p - pos0] for the last min(n, K) positions (raw inputs, not convolved)
// Design decision: a ring indexed by absolute position, not K-1 rows shifted per step, so a
// decode step writes one row and no reader of the same step needs it (cuda/gdn_decode.cu writes
// it from the blocks that read the others, with no second launch).
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
                   int64_t pos0, float* state, float* out) {
  if (K < 1 || K > kMaxK) throw std::invalid_argument("conv1d_causal: kernel width must be 1..16");
  if (pos0 < 0) throw std::invalid_argument("conv1d_causal: negative position");
  if (n <= 0 || C <= 0) return;
  const int64_t n_blocks = (C + kBlock - 1) / kBlock;
  // Channels c0.. of x(pos0 + i): u row i, or for i < 0 the ring row of that earlier position
  // (i >= -(K-1), so pos0 + i + K > 0 and the modulo stays non-negative).
  auto x_row = [&](int64_t i, int64_t c0) -> const float* {
    return i >= 0 ? u + i * u_stride + c0 : state + (pos0 + i + K) % K * C + c0;
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
              const float* xr = x_row(t - (K - 1) + j, c0);
              for (int64_t c = 0; c < nc; ++c) acc[c] += wt[j][c] * xr[c];
            }
            float* o = out + t * C + c0;
            for (int64_t c = 0; c < nc; ++c) o[c] = silu(acc[c]);
          }
          // Only after this block's outputs: they may still have read the rows written here.
          for (int64_t i = std::max<int64_t>(0, n - K); i < n; ++i) {
            const float* src = u + i * u_stride + c0;
            float* dst = state + (pos0 + i) % K * C + c0;
            for (int64_t c = 0; c < nc; ++c) dst[c] = src[c];
          }
        }
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(n * K * kBlock, 1)));
}

}  // namespace cpu
}  // namespace pe
