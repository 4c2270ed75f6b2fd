// Element-wise ops of the MLP and the residual stream.
//   swiglu: gate_up [n, 2I] (gate = first I columns, up = next I) -> out [n, I] = silu(gate) * up
//   add:    out[i] = a[i] + b[i]; out may alias a (the residual add h += f(h)).
// Parallel over blocks of rows/elements once there is enough work to pay for a wake-up.
#include <algorithm>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {

void swiglu(const float* gate_up, int64_t n, int64_t I, float* out) {
  // Tasks are (token, block of columns) so a single decode token still spreads over threads.
  constexpr int64_t kCols = 4096;
  const int64_t n_cb = std::max<int64_t>(1, (I + kCols - 1) / kCols);
  parallel_for(
      n * n_cb,
      [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
          const int64_t t = task / n_cb, c0 = (task % n_cb) * kCols, c1 = std::min(I, c0 + kCols);
          const float* g = gate_up + t * 2 * I;
          const float* u = g + I;
          float* o = out + t * I;
          for (int64_t j = c0; j < c1; ++j) o[j] = silu(g[j]) * u[j];
        }
      },
      std::max<int64_t>(1, 16384 / std::min(std::max<int64_t>(I, 1), kCols)));
}

void add(const float* a, const float* b, int64_t n, float* out) {
  constexpr int64_t kBlock = 16384;
  parallel_for(
      (n + kBlock - 1) / kBlock,
      [&](int64_t begin, int64_t end) {
        const int64_t lo = begin * kBlock, hi = std::min(n, end * kBlock);
        for (int64_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
      },
      4);
}

}  // namespace cpu
}  // namespace pe
