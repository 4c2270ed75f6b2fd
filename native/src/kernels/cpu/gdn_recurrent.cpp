// Gated DeltaNet: the per-token gates and the token-by-token gated delta rule.
//
// gdn_gates, per token t and value head h (a, b rows of stride ab_stride):
//   beta = sigmoid(b),  g = -exp(A_log[h]) * softplus(a + dt_bias[h])   (softplus(x) = x for x > 20,
//   as torch's default threshold).
// gdn_recurrent, per value head h (key head h / (Hv / Hk)), state S_h [dk, dv] row-major, per token:
//   S = exp(g) S;  delta = beta (v - S^T k);  S += k delta^T;  o = S^T q
// fused into two sweeps over the rows of S: (decay, S^T k) then (rank-1 update, S^T q); every
// inner loop runs over dv contiguous floats. Parallel over value heads (each owns its S slice).
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/gdn_step.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {

void gdn_gates(const float* a, const float* b, int64_t ab_stride, int64_t n, int64_t n_heads,
               const float* A_log, const float* dt_bias, float* g, float* beta) {
  for (int64_t t = 0; t < n; ++t) {
    const float* at = a + t * ab_stride;
    const float* bt = b + t * ab_stride;
    for (int64_t h = 0; h < n_heads; ++h) {
      const float x = at[h] + dt_bias[h];
      const float sp = x > 20.0f ? x : std::log1p(std::exp(x));
      g[t * n_heads + h] = -std::exp(A_log[h]) * sp;
      beta[t * n_heads + h] = sigmoid(bt[h]);
    }
  }
}

void gdn_recurrent(const GdnArgs& a) {
  if (a.n <= 0) return;
  if (a.Hk <= 0 || a.Hv % a.Hk != 0)
    throw std::invalid_argument("gdn_recurrent: Hv must be a multiple of Hk");
  const int64_t r = a.Hv / a.Hk, dk = a.dk, dv = a.dv;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(a.n * dk * dv, 1));
  parallel_for(
      a.Hv,
      [&](int64_t begin, int64_t end) {
        float* kv_mem = scratch(0, static_cast<size_t>(2 * dv));
        float* delta = kv_mem + dv;
        for (int64_t h = begin; h < end; ++h) {
          const int64_t kh = h / r;
          float* S = a.state + h * dk * dv;
          for (int64_t t = 0; t < a.n; ++t) {
            const float* q = a.q + t * a.qk_stride + kh * dk;
            const float* k = a.k + t * a.qk_stride + kh * dk;
            const float* v = a.v + t * a.v_stride + h * dv;
            gdn_step(S, q, k, v, a.g[t * a.Hv + h], a.beta[t * a.Hv + h], dk, dv, kv_mem, delta,
                     a.out + (t * a.Hv + h) * dv);
          }
        }
      },
      grain);
}

}  // namespace cpu
}  // namespace pe
