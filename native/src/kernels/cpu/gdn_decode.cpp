// GDN decode step batched over sequences in different state slots (the CPU twin of
// cuda::gdn_decode). Per sequence i (slot s = slots[i]), one token:
//   y = silu(conv over positions pos_i - K + 1 .. pos_i: the ring rows of conv_state_s, then qkv_i)
//   (qkv_i -> ring row pos_i % K)
//   q = l2norm(y_q) / sqrt(dk),  k = l2norm(y_k),  v = y_v
//   g = -exp(A_log) softplus(a_i + dt_bias),  beta = sigmoid(b_i)
//   per value head h (key head h / (Hv/Hk)): S = e^g S; S += k (beta (v - S^T k))^T; o = S^T q
//   optionally (norm_w): o = rms_norm_gated(o, z_i,h)
// With rows / out_slots (ops.h), item i reads token row rows[i] and its updated states go to
// out_slots[i] (copies of slots[i]'s, then stepped), which is how a verify chunk's tokens run.
// Phase 1 runs the per-sequence ops themselves (cheap at one token), phase 2 the recurrent step
// in parallel over (sequence, value head): the state slices are disjoint because slots are.
// The recurrent step is gdn_recurrent's (gdn_step.h), so the result is the per-sequence ops' bits.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/threadpool.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/gdn_step.h"
#include "kernels/ops.h"

namespace pe {
namespace cpu {
namespace {

constexpr int kSlotY = 7;  // conv outputs and gates of every sequence (calling thread)

}  // namespace

void gdn_decode(const GdnDecodeArgs& a) {
  if (a.n_seqs <= 0) return;
  if (a.Hk <= 0 || a.Hv % a.Hk != 0) throw std::invalid_argument("gdn_decode: Hv must be a multiple of Hk");
  if (a.dk <= 0 || a.dv <= 0) throw std::invalid_argument("gdn_decode: dk and dv must be positive");
  const int64_t n = a.n_seqs, Hk = a.Hk, Hv = a.Hv, dk = a.dk, dv = a.dv;
  const int64_t C = 2 * Hk * dk + Hv * dv, r = Hv / Hk;
  const int64_t qkv_stride = a.qkv_stride ? a.qkv_stride : C, ab_stride = a.ab_stride ? a.ab_stride : Hv;
  const auto row = [&](int64_t i) -> int64_t { return a.rows ? a.rows[i] : i; };
  const auto out_slot = [&](int64_t i) -> int64_t { return a.out_slots ? a.out_slots[i] : a.slots[i]; };
  float* y = scratch(kSlotY, static_cast<size_t>(n * (C + 2 * Hv)));
  float* g = y + n * C;
  float* beta = g + n * Hv;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t i = 0; i < n; ++i) {
    float* yi = y + i * C;
    float* ring = a.conv_state + out_slot(i) * a.conv_slot_stride;
    if (out_slot(i) != a.slots[i])
      std::copy_n(a.conv_state + a.slots[i] * a.conv_slot_stride, a.K * C, ring);
    conv1d_causal(a.qkv + row(i) * qkv_stride, 1, C, C, a.conv_w, a.K, a.pos[i], ring, yi);
    l2_norm(yi, Hk, dk, 1e-6f, q_scale);
    l2_norm(yi + Hk * dk, Hk, dk, 1e-6f, 1.0f);
    gdn_gates(a.a + row(i) * ab_stride, a.b + row(i) * ab_stride, ab_stride, 1, Hv, a.A_log, a.dt_bias, g + i * Hv,
              beta + i * Hv);
  }
  parallel_for(
      n * Hv,
      [&](int64_t begin, int64_t end) {
        float* kv_mem = scratch(0, static_cast<size_t>(2 * dv));
        for (int64_t task = begin; task < end; ++task) {
          const int64_t i = task / Hv, h = task % Hv, kh = h / r;
          const float* yi = y + i * C;
          float* S = a.rec_state + out_slot(i) * a.rec_slot_stride + h * dk * dv;
          if (out_slot(i) != a.slots[i])
            std::copy_n(a.rec_state + a.slots[i] * a.rec_slot_stride + h * dk * dv, dk * dv, S);
          gdn_step(S, yi + kh * dk, yi + Hk * dk + kh * dk, yi + 2 * Hk * dk + h * dv, g[task], beta[task], dk, dv,
                   kv_mem, kv_mem + dv, a.out + (row(i) * Hv + h) * dv);
        }
      },
      std::max<int64_t>(1, 32768 / (dk * dv)));
  if (a.norm_w)
    for (int64_t i = 0; i < n; ++i) {
      float* o = a.out + row(i) * Hv * dv;
      rms_norm_gated(o, a.z + row(i) * a.z_stride, a.norm_w, Hv, dv, a.norm_eps, o);
    }
}

void gdn_chain(const GdnChainArgs& a) {
  int32_t n_max = 0;
  for (int64_t i = 0; i < a.n_seqs; ++i) n_max = std::max(n_max, a.n_tok[i]);
  std::vector<int32_t> rows, in, out, pos;
  for (int32_t t = 0; t < n_max; ++t) {  // call t: every sequence's token t
    rows.clear(), in.clear(), out.clear(), pos.clear();
    for (int64_t i = 0; i < a.n_seqs; ++i) {
      if (t >= a.n_tok[i]) continue;
      rows.push_back(a.row0[i] + t);
      in.push_back(t == 0 ? a.slots[i] : a.out_slots[a.out_off[i] + t - 1]);
      out.push_back(a.out_slots[a.out_off[i] + t]);
      pos.push_back(a.pos0[i] + t);
    }
    GdnDecodeArgs d{static_cast<int64_t>(rows.size()), a.qkv, a.a, a.b, a.conv_w, a.A_log, a.dt_bias, in.data(),
                    pos.data(), a.conv_state, a.conv_slot_stride, a.rec_state, a.rec_slot_stride, a.Hk, a.Hv, a.dk,
                    a.dv, a.K, a.out};
    d.rows = rows.data();
    d.out_slots = out.data();
    d.qkv_stride = a.qkv_stride;
    d.ab_stride = a.ab_stride;
    d.chained = t > 0;
    gdn_decode(d);
  }
}

}  // namespace cpu
}  // namespace pe
