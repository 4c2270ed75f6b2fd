// cuda::gdn_decode against its CPU twin cpu::gdn_decode (itself checked against the per-sequence
// ops and the conv over the whole input history in test_ops_gdn_decode): n_seqs 1, 3, 17,
// permuted non-contiguous slots in a pool of two layers per slot (slot stride != layer size),
// sequences prefilled (conv1d_causal) to different positions, then several decode steps with
// both states carried (the positions pass through every conv ring row), the test
// checkpoints' head shapes, awkward ones (dk != dv, dv not a multiple of 4 or above 128, dk > 128,
// conv widths 1 to 6) and the 27B shape.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "test_cuda_util.h"

using namespace pe;
using pe_test::DevBuf;

namespace {

struct Shape {
  int64_t hk, hv, dk, dv, K;
  int64_t conv_dim() const { return 2 * hk * dk + hv * dv; }
};

// fused_norm: the gated RMSNorm fused (z rows with a stride wider than Hv * dv, as the fused
// projection's z part), against the CPU twin's fused form.
void check_decode(const Shape& s, int64_t n, int steps, uint64_t seed, bool fused_norm = false) {
  pe_test::Rng rng(seed);
  const int64_t C = s.conv_dim(), n_slots = n + 5;
  const int64_t conv_layer = s.K * C, rec_layer = s.hv * s.dk * s.dv;
  const auto conv_w = rng.normals(C * s.K, 0.5f);
  const auto A_log = rng.uniforms(s.hv, -2.0f, 1.0f), dt_bias = rng.normals(s.hv);
  // Two layers per slot; the op works on layer 1.
  std::vector<float> conv_pool = rng.normals(n_slots * 2 * conv_layer);
  std::vector<float> rec_pool = rng.normals(n_slots * 2 * rec_layer, 0.3f);
  std::vector<int32_t> slots(n_slots);
  for (int64_t i = 0; i < n_slots; ++i) slots[i] = static_cast<int32_t>(n_slots - 1 - i);
  for (int64_t i = n_slots - 1; i > 0; --i) std::swap(slots[i], slots[rng.below(i + 1)]);
  slots.resize(n);
  // The sequences' rings start zeroed (new sequences) and are prefilled to different positions.
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) {
    pos[i] = static_cast<int32_t>(rng.below(3 * s.K + 1));
    std::fill_n(conv_pool.begin() + (slots[i] * 2 + 1) * conv_layer, conv_layer, 0.0f);
  }

  DevBuf<float> d_w(conv_w), d_A(A_log), d_dt(dt_bias), d_conv(conv_pool), d_rec(rec_pool);
  for (int64_t i = 0; i < n; ++i) {  // each twin's prefill conv on its own pool
    if (pos[i] == 0) continue;
    const auto prompt = rng.normals(pos[i] * C);
    std::vector<float> y(pos[i] * C);
    DevBuf<float> d_prompt(prompt), d_y(pos[i] * C);
    const int64_t ring = (slots[i] * 2 + 1) * conv_layer;
    cpu::conv1d_causal(prompt.data(), pos[i], C, C, conv_w.data(), s.K, 0, conv_pool.data() + ring, y.data());
    cuda::conv1d_causal(d_prompt.p, pos[i], C, C, d_w.p, s.K, 0, d_conv.p + ring, d_y.p, nullptr);
  }
  DevBuf<int32_t> d_slots(slots), d_pos(pos);
  DevBuf<float> d_qkv(n * C), d_a(n * s.hv), d_b(n * s.hv), d_out(n * s.hv * s.dv);
  const int64_t z_stride = s.hv * s.dv + 24;
  const auto z = rng.normals(n * z_stride, 2.0f), norm_w = rng.normals(s.dv, 0.5f);
  DevBuf<float> d_z(z), d_norm(norm_w);
  auto args = [&](const float* qkv, const float* a, const float* b, const float* w, const float* A,
                  const float* dt, const int32_t* sl, const int32_t* ps, float* conv, float* rec, float* out,
                  bool dev) {
    cpu::GdnDecodeArgs r{n, qkv, a, b, w, A, dt, sl, ps, conv + conv_layer, 2 * conv_layer,
                         rec + rec_layer, 2 * rec_layer, s.hk, s.hv, s.dk, s.dv, s.K, out};
    if (fused_norm) {
      r.z = dev ? d_z.p : z.data();
      r.z_stride = z_stride;
      r.norm_w = dev ? d_norm.p : norm_w.data();
      r.norm_eps = 1e-6f;
    }
    return r;
  };
  const std::string cfg = cfgs("Hk%lld Hv%lld dk%lld dv%lld K%lld n=%lld%s", (long long)s.hk,
                               (long long)s.hv, (long long)s.dk, (long long)s.dv, (long long)s.K,
                               (long long)n, fused_norm ? " fused norm" : "");
  for (int step = 0; step < steps; ++step) {
    const auto qkv = rng.normals(n * C), a = rng.normals(n * s.hv, 2.0f), b = rng.normals(n * s.hv, 2.0f);
    std::vector<float> want(n * s.hv * s.dv);
    cpu::gdn_decode(args(qkv.data(), a.data(), b.data(), conv_w.data(), A_log.data(), dt_bias.data(),
                         slots.data(), pos.data(), conv_pool.data(), rec_pool.data(), want.data(), false));
    d_pos.upload(pos);
    d_qkv.upload(qkv);
    d_a.upload(a);
    d_b.upload(b);
    d_out.poison();
    cuda::gdn_decode(args(d_qkv.p, d_a.p, d_b.p, d_w.p, d_A.p, d_dt.p, d_slots.p, d_pos.p, d_conv.p, d_rec.p,
                          d_out.p, true),
                     nullptr);
    EXPECT_CLOSE("gdn_decode", cfg + cfgs(" step %d", step), d_out.download(), want, 1e-5);
    for (int32_t& p : pos) ++p;
  }
  EXPECT_CLOSE("gdn_decode", cfg + " rec state", d_rec.download(), rec_pool, 1e-5);
  EXPECT_CLOSE("gdn_decode", cfg + " conv state", d_conv.download(), conv_pool, 0.0);
}

}  // namespace

TEST(cuda_gdn_decode) {
  // Test checkpoints' shapes; dk != dv; dv not a multiple of 4 (scalar path) or above 128 (two
  // and three column blocks); dk > 128; K 1 (a ring of one row), 2, 3, and 6 (past the taps the
  // conv loads at once: its loop; dk 128 as the 27B kernel); K + 2 steps. Readers of a key head's
  // q/k rows (Hv/Hk x column blocks, one of which writes their new ring row): 1 ({2, 2, ...}), 2,
  // 3, 4 ({1, 2, 64, 160}) and 12 ({1, 4, 32, 260}).
  const Shape shapes[] = {{2, 4, 32, 32, 4}, {2, 2, 64, 64, 4},   {1, 3, 24, 40, 2},  {2, 6, 20, 8, 4},
                          {2, 4, 32, 30, 4}, {1, 2, 64, 160, 4},  {1, 2, 200, 48, 3}, {2, 4, 32, 32, 1},
                          {1, 2, 128, 64, 6}, {1, 4, 32, 260, 6}, {2, 2, 16, 16, 6}};
  for (const Shape& s : shapes)
    for (int64_t n : {1, 3, 17}) check_decode(s, n, static_cast<int>(s.K + 2), 200 + n);
}

TEST(cuda_gdn_decode_fused_norm) {
  // The gated RMSNorm fused (dv <= 128): the shapes above that take it (dv 8, 30 on the scalar
  // path, 128), and the op's refusal above 128.
  const Shape shapes[] = {{2, 4, 32, 32, 4}, {2, 6, 20, 8, 4}, {2, 4, 32, 30, 4}, {1, 2, 200, 48, 3},
                          {16, 48, 128, 128, 4}};
  for (const Shape& s : shapes)
    for (int64_t n : {1, 3, 17}) check_decode(s, n, 2, 400 + n, true);
  cpu::GdnDecodeArgs big{};
  big.n_seqs = 1, big.Hk = 1, big.Hv = 1, big.dk = 8, big.dv = 160, big.K = 4;
  float w = 1.0f;
  big.norm_w = &w;
  bool refused = false;
  try {
    cuda::gdn_decode(big, nullptr);  // refused before any launch: no device pointer is read
  } catch (const std::exception&) {
    refused = true;
  }
  CHECK(refused);
}

TEST(cuda_gdn_decode_27b_shape) {
  for (int64_t n : {1, 3, 17}) {
    if (small_only() && n > 3) continue;
    check_decode({16, 48, 128, 128, 4}, n, 5, 300 + n);
  }
}
