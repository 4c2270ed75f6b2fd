// One token of the gated delta rule for one value head, shared by gdn_recurrent and gdn_decode
// so both give the same bits: S = e^g S; kv = S^T k; delta = beta (v - kv); S += k delta^T;
// o = S^T q. S [dk, dv] in place; kv_mem, delta: dv floats of scratch.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pe {
namespace cpu {

inline void gdn_step(float* S, const float* q, const float* k, const float* v, float g, float beta, int64_t dk,
                     int64_t dv, float* kv_mem, float* delta, float* o) {
  const float decay = std::exp(g);
  // Sweep 1: S *= decay; kv_mem = S^T k.
  std::fill(kv_mem, kv_mem + dv, 0.0f);
  for (int64_t i = 0; i < dk; ++i) {
    float* Si = S + i * dv;
    const float ki = k[i];
    for (int64_t j = 0; j < dv; ++j) {
      Si[j] *= decay;
      kv_mem[j] += Si[j] * ki;
    }
  }
  for (int64_t j = 0; j < dv; ++j) delta[j] = beta * (v[j] - kv_mem[j]);
  // Sweep 2: S += k delta^T; o = S^T q.
  std::fill(o, o + dv, 0.0f);
  for (int64_t i = 0; i < dk; ++i) {
    float* Si = S + i * dv;
    const float ki = k[i], qi = q[i];
    for (int64_t j = 0; j < dv; ++j) {
      Si[j] += ki * delta[j];
      o[j] += Si[j] * qi;
    }
  }
}

}  // namespace cpu
}  // namespace pe
