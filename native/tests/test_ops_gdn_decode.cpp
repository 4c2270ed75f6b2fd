// cpu::gdn_decode (one token for each of n sequences in their own state slots) against the
// per-sequence ops the model calls for a 1-token chunk (conv1d_causal, l2_norm x2, gdn_gates,
// gdn_recurrent): a hand-computed case, then seeded random pools with permuted, non-contiguous
// slots, two layers per slot (slot stride != layer size), several steps with the state carried.
#include <algorithm>
#include <cmath>
#include <vector>

#include "check.h"
#include "kernels/ops.h"

using namespace pe;

namespace {

struct Shape {
  int64_t hk, hv, dk, dv, K;
  int64_t conv_dim() const { return 2 * hk * dk + hv * dv; }
};

// A GDN layer's weights and a state pool of n_slots slots x 2 layers (the layer under test is
// layer 1), with random contents.
struct Layer {
  Shape s;
  int64_t n_slots, conv_layer, rec_layer;  // floats of one layer's conv / recurrent state
  std::vector<float> conv_w, A_log, dt_bias, conv_pool, rec_pool;
  Layer(const Shape& sh, int64_t slots, pe_test::Rng& rng) : s(sh), n_slots(slots) {
    conv_layer = (s.K - 1) * s.conv_dim();
    rec_layer = s.hv * s.dk * s.dv;
    conv_w = rng.normals(s.conv_dim() * s.K, 0.5f);
    A_log = rng.uniforms(s.hv, -2.0f, 1.0f);
    dt_bias = rng.normals(s.hv);
    conv_pool = rng.normals(n_slots * 2 * conv_layer);
    rec_pool = rng.normals(n_slots * 2 * rec_layer, 0.3f);
  }
  float* conv_state(int64_t slot) { return conv_pool.data() + (slot * 2 + 1) * conv_layer; }
  float* rec_state(int64_t slot) { return rec_pool.data() + (slot * 2 + 1) * rec_layer; }
};

// n distinct slots out of n_slots, in random order.
std::vector<int32_t> pick_slots(int64_t n, int64_t n_slots, pe_test::Rng& rng) {
  std::vector<int32_t> all(n_slots);
  for (int64_t i = 0; i < n_slots; ++i) all[i] = static_cast<int32_t>(i);
  for (int64_t i = n_slots - 1; i > 0; --i) std::swap(all[i], all[rng.below(i + 1)]);
  all.resize(n);
  return all;
}

// The model's per-sequence path for one token of sequence i (mixer_gdn with a 1-token chunk).
void reference_step(Layer& L, const float* qkv, const float* a, const float* b, int32_t slot,
                    float* out) {
  const Shape& s = L.s;
  const int64_t C = s.conv_dim();
  std::vector<float> y(C), g(s.hv), beta(s.hv);
  cpu::conv1d_causal(qkv, 1, C, C, L.conv_w.data(), s.K, L.conv_state(slot), y.data());
  cpu::l2_norm(y.data(), s.hk, s.dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(s.dk)));
  cpu::l2_norm(y.data() + s.hk * s.dk, s.hk, s.dk, 1e-6f, 1.0f);
  cpu::gdn_gates(a, b, s.hv, 1, s.hv, L.A_log.data(), L.dt_bias.data(), g.data(), beta.data());
  cpu::GdnArgs args{y.data(), y.data() + s.hk * s.dk, C, y.data() + 2 * s.hk * s.dk, C, g.data(),
                    beta.data(), 1, s.hk, s.hv, s.dk, s.dv, L.rec_state(slot), out};
  cpu::gdn_recurrent(args);
}

cpu::GdnDecodeArgs decode_args(Layer& L, int64_t n, const float* qkv, const float* a,
                               const float* b, const int32_t* slots, float* out) {
  const Shape& s = L.s;
  return {n, qkv, a, b, L.conv_w.data(), L.A_log.data(), L.dt_bias.data(), slots,
          L.conv_state(0), 2 * L.conv_layer, L.rec_state(0), 2 * L.rec_layer,
          s.hk, s.hv, s.dk, s.dv, s.K, out};
}

void check_decode(const Shape& s, int64_t n, int steps, uint64_t seed) {
  pe_test::Rng rng(seed);
  Layer batched(s, n + 5, rng);
  Layer ref = batched;
  const std::vector<int32_t> slots = pick_slots(n, batched.n_slots, rng);
  const int64_t C = s.conv_dim();
  for (int step = 0; step < steps; ++step) {
    const auto qkv = rng.normals(n * C), a = rng.normals(n * s.hv, 2.0f), b = rng.normals(n * s.hv, 2.0f);
    std::vector<float> out(n * s.hv * s.dv, NAN), want(n * s.hv * s.dv);
    cpu::gdn_decode(decode_args(batched, n, qkv.data(), a.data(), b.data(), slots.data(), out.data()));
    for (int64_t i = n - 1; i >= 0; --i)  // another order: the sequences are independent
      reference_step(ref, qkv.data() + i * C, a.data() + i * s.hv, b.data() + i * s.hv, slots[i],
                     want.data() + i * s.hv * s.dv);
    CHECK(out == want);
    CHECK(batched.conv_pool == ref.conv_pool);  // untouched slots and layer 0 included
    CHECK(batched.rec_pool == ref.rec_pool);
  }
}

}  // namespace

TEST(gdn_decode_simple) {
  // One head of size 1, K = 2, w = [0, 1] per channel: y = silu(new row). Recurrent state 2,
  // q, k, v = silu(2), silu(-3), silu(5); the l2 norm (dk = 1) maps q, k to about +1, -1.
  const Shape s{1, 1, 1, 1, 2};
  const float w[6] = {0, 1, 0, 1, 0, 1}, A_log[1] = {0.0f}, dt_bias[1] = {0.5f};
  const float qkv[3] = {2, -3, 5}, a[1] = {0.25f}, b[1] = {0.0f};
  float conv_state[3] = {7, 8, 9}, rec_state[1] = {2.0f}, out[1] = {NAN};
  const int32_t slot[1] = {0};
  cpu::gdn_decode({1, qkv, a, b, w, A_log, dt_bias, slot, conv_state, 3, rec_state, 1, s.hk, s.hv,
                   s.dk, s.dv, s.K, out});
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  auto l2 = [](double x) { return x / std::sqrt(x * x + 1e-6); };
  const double q = l2(silu(2.0)), k = l2(silu(-3.0)), v = silu(5.0), beta = 0.5;
  const double g = -std::log1p(std::exp(0.75));  // -exp(0) * softplus(0.25 + 0.5)
  const double S0 = 2.0 * std::exp(g), S = S0 + k * beta * (v - S0 * k);
  CHECK_NEAR(out[0], S * q, 1e-5);
  CHECK_NEAR(rec_state[0], S, 1e-5);
  CHECK_EQ(conv_state[0], 2.0f);
  CHECK_EQ(conv_state[1], -3.0f);
  CHECK_EQ(conv_state[2], 5.0f);
}

TEST(gdn_decode_equals_per_sequence_ops) {
  // Test checkpoints' head shapes, awkward ones (dk != dv, not multiples of 32, GQA 3), K 1, 2, 4.
  const Shape shapes[] = {{2, 4, 32, 32, 4}, {2, 2, 64, 64, 4}, {1, 3, 24, 40, 2},
                          {2, 6, 20, 8, 4},  {2, 4, 32, 32, 1}};
  for (const Shape& s : shapes)
    for (int64_t n : {1, 3, 17}) check_decode(s, n, 3, 100 + n);
}

TEST(gdn_decode_27b_shape) { check_decode({16, 48, 128, 128, 4}, 3, 2, 7); }

TEST(gdn_decode_fused_norm_equals_separate_norm) {
  // norm_w set: out = rms_norm_gated(o, z rows with a stride, norm_w) of the unfused op, bit for bit.
  for (const Shape& s : {Shape{2, 4, 32, 32, 4}, Shape{1, 3, 24, 40, 2}, Shape{16, 48, 128, 128, 4}})
    for (int64_t n : {1, 3}) {
      pe_test::Rng rng(500 + n);
      Layer fused(s, n + 5, rng);
      Layer plain = fused;
      const std::vector<int32_t> slots = pick_slots(n, fused.n_slots, rng);
      const int64_t C = s.conv_dim(), z_stride = s.hv * s.dv + 8;
      const auto qkv = rng.normals(n * C), a = rng.normals(n * s.hv), b = rng.normals(n * s.hv);
      const auto z = rng.normals(n * z_stride), w = rng.normals(s.dv);
      std::vector<float> got(n * s.hv * s.dv), want(n * s.hv * s.dv), zd(n * s.hv * s.dv);
      cpu::GdnDecodeArgs fa = decode_args(fused, n, qkv.data(), a.data(), b.data(), slots.data(), got.data());
      fa.z = z.data(), fa.z_stride = z_stride, fa.norm_w = w.data(), fa.norm_eps = 1e-6f;
      cpu::gdn_decode(fa);
      cpu::gdn_decode(decode_args(plain, n, qkv.data(), a.data(), b.data(), slots.data(), want.data()));
      for (int64_t i = 0; i < n; ++i)
        std::copy(z.begin() + i * z_stride, z.begin() + i * z_stride + s.hv * s.dv, zd.begin() + i * s.hv * s.dv);
      cpu::rms_norm_gated(want.data(), zd.data(), w.data(), n * s.hv, s.dv, 1e-6f, want.data());
      CHECK(got == want);
      CHECK(fused.rec_pool == plain.rec_pool);
    }
}
