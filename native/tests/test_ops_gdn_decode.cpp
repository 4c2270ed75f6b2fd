// cpu::gdn_decode (one token for each of n sequences in their own state slots) against the
// per-sequence ops the model calls for a 1-token chunk (conv1d_causal, l2_norm x2, gdn_gates,
// gdn_recurrent), bit for bit, and against the same ops with the conv computed naively over each
// sequence's whole input history (the ring's contents checked against that history too): a
// hand-computed case, then seeded random pools with permuted, non-contiguous slots, two layers
// per slot (slot stride != layer size), sequences prefilled to different positions (fewer than
// K - 1 inputs, and more than K), then several decode steps with the state carried (positions
// that wrap the ring).
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
  int64_t n_slots, conv_layer, rec_layer;  // floats of one layer's conv ring / recurrent state
  std::vector<float> conv_w, A_log, dt_bias, conv_pool, rec_pool;
  Layer(const Shape& sh, int64_t slots, pe_test::Rng& rng) : s(sh), n_slots(slots) {
    conv_layer = s.K * s.conv_dim();
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

// The ring of a sequence whose raw inputs so far are `history` (rows of C): row q % K = input q
// for its last K inputs, rows never written zero.
void write_ring(float* ring, const std::vector<float>& history, int64_t C, int64_t K) {
  const int64_t len = static_cast<int64_t>(history.size()) / C;
  std::fill(ring, ring + K * C, 0.0f);
  for (int64_t q = std::max<int64_t>(0, len - K); q < len; ++q)
    std::copy(history.begin() + q * C, history.begin() + (q + 1) * C, ring + q % K * C);
}

// After the conv: what the model does for a 1-token chunk of sequence i (mixer_gdn).
void rest_of_step(Layer& L, std::vector<float>& y, const float* a, const float* b, int32_t slot, float* out) {
  const Shape& s = L.s;
  const int64_t C = s.conv_dim();
  std::vector<float> g(s.hv), beta(s.hv);
  cpu::l2_norm(y.data(), s.hk, s.dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(s.dk)));
  cpu::l2_norm(y.data() + s.hk * s.dk, s.hk, s.dk, 1e-6f, 1.0f);
  cpu::gdn_gates(a, b, s.hv, 1, s.hv, L.A_log.data(), L.dt_bias.data(), g.data(), beta.data());
  cpu::GdnArgs args{y.data(), y.data() + s.hk * s.dk, C, y.data() + 2 * s.hk * s.dk, C, g.data(),
                    beta.data(), 1, s.hk, s.hv, s.dk, s.dv, L.rec_state(slot), out};
  cpu::gdn_recurrent(args);
}

// The model's per-sequence path for one token at position pos (conv1d_causal on the ring).
void reference_step(Layer& L, const float* qkv, const float* a, const float* b, int32_t slot, int32_t pos,
                    float* out) {
  const int64_t C = L.s.conv_dim();
  std::vector<float> y(C);
  cpu::conv1d_causal(qkv, 1, C, C, L.conv_w.data(), L.s.K, pos, L.conv_state(slot), y.data());
  rest_of_step(L, y, a, b, slot, out);
}

// The same step with the conv taken over the history (its last row: the new input), in double.
void naive_step(Layer& L, const std::vector<float>& history, const float* a, const float* b, int32_t slot,
                float* out) {
  const int64_t C = L.s.conv_dim(), K = L.s.K, p = static_cast<int64_t>(history.size()) / C - 1;
  std::vector<float> y(C);
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0.0;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t q = p - (K - 1) + j;
      if (q >= 0) acc += static_cast<double>(L.conv_w[c * K + j]) * history[q * C + c];
    }
    y[c] = static_cast<float>(acc / (1.0 + std::exp(-acc)));
  }
  rest_of_step(L, y, a, b, slot, out);
}

cpu::GdnDecodeArgs decode_args(Layer& L, int64_t n, const float* qkv, const float* a, const float* b,
                               const int32_t* slots, const int32_t* pos, float* out) {
  const Shape& s = L.s;
  return {n,   qkv, a, b, L.conv_w.data(), L.A_log.data(), L.dt_bias.data(), slots, pos, L.conv_state(0),
          2 * L.conv_layer, L.rec_state(0), 2 * L.rec_layer, s.hk, s.hv, s.dk, s.dv, s.K, out};
}

void check_decode(const Shape& s, int64_t n, int steps, uint64_t seed) {
  pe_test::Rng rng(seed);
  Layer batched(s, n + 5, rng);
  const std::vector<int32_t> slots = pick_slots(n, batched.n_slots, rng);
  const int64_t C = s.conv_dim();
  // Each sequence starts with a prefill of 0 .. 3K random inputs (a fresh, zeroed ring).
  std::vector<std::vector<float>> history(n);
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) {
    pos[i] = static_cast<int32_t>(rng.below(3 * s.K + 1));
    history[i] = rng.normals(pos[i] * C);
    float* ring = batched.conv_state(slots[i]);
    std::fill(ring, ring + batched.conv_layer, 0.0f);
    std::vector<float> y(pos[i] * C);
    cpu::conv1d_causal(history[i].data(), pos[i], C, C, batched.conv_w.data(), s.K, 0, ring, y.data());
  }
  Layer ref = batched, naive = batched;
  for (int step = 0; step < steps; ++step) {
    const auto qkv = rng.normals(n * C), a = rng.normals(n * s.hv, 2.0f), b = rng.normals(n * s.hv, 2.0f);
    std::vector<float> out(n * s.hv * s.dv, NAN), want(n * s.hv * s.dv), near(n * s.hv * s.dv);
    cpu::gdn_decode(decode_args(batched, n, qkv.data(), a.data(), b.data(), slots.data(), pos.data(), out.data()));
    for (int64_t i = n - 1; i >= 0; --i) {  // another order: the sequences are independent
      reference_step(ref, qkv.data() + i * C, a.data() + i * s.hv, b.data() + i * s.hv, slots[i], pos[i],
                     want.data() + i * s.hv * s.dv);
      history[i].insert(history[i].end(), qkv.begin() + i * C, qkv.begin() + (i + 1) * C);
      naive_step(naive, history[i], a.data() + i * s.hv, b.data() + i * s.hv, slots[i],
                 near.data() + i * s.hv * s.dv);
      ++pos[i];
    }
    CHECK(out == want);
    CHECK_CLOSE(out.data(), near.data(), n * s.hv * s.dv, 1e-5);
    CHECK(batched.conv_pool == ref.conv_pool);  // untouched slots and layer 0 included
    CHECK(batched.rec_pool == ref.rec_pool);
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> ring(s.K * C);
      write_ring(ring.data(), history[i], C, s.K);
      CHECK(std::equal(ring.begin(), ring.end(), batched.conv_state(slots[i])));
    }
  }
  CHECK_CLOSE(batched.rec_pool.data(), naive.rec_pool.data(), static_cast<int64_t>(batched.rec_pool.size()), 1e-5);
}

}  // namespace

TEST(gdn_decode_simple) {
  // One head of size 1, K = 2, w = [0.5, 1] per channel, the token at position 5: its taps are
  // ring row 0 (position 4: 7, 8, 9; row 1, position 3, is not read) and the new row (2, -3, 5),
  // so q, k, v = silu(5.5), silu(1), silu(9.5). Recurrent state 2; the l2 norm (dk = 1) maps q, k
  // to about +1, +1. The new row replaces row 1.
  const Shape s{1, 1, 1, 1, 2};
  const float w[6] = {0.5f, 1, 0.5f, 1, 0.5f, 1}, A_log[1] = {0.0f}, dt_bias[1] = {0.5f};
  const float qkv[3] = {2, -3, 5}, a[1] = {0.25f}, b[1] = {0.0f};
  float conv_state[6] = {7, 8, 9, -1, -1, -1}, rec_state[1] = {2.0f}, out[1] = {NAN};
  const int32_t slot[1] = {0}, pos[1] = {5};
  cpu::gdn_decode({1, qkv, a, b, w, A_log, dt_bias, slot, pos, conv_state, 6, rec_state, 1, s.hk, s.hv,
                   s.dk, s.dv, s.K, out});
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  auto l2 = [](double x) { return x / std::sqrt(x * x + 1e-6); };
  const double q = l2(silu(5.5)), k = l2(silu(1.0)), v = silu(9.5), beta = 0.5;
  const double g = -std::log1p(std::exp(0.75));  // -exp(0) * softplus(0.25 + 0.5)
  const double S0 = 2.0 * std::exp(g), S = S0 + k * beta * (v - S0 * k);
  CHECK_NEAR(out[0], S * q, 1e-5);
  CHECK_NEAR(rec_state[0], S, 1e-5);
  const float ring[6] = {7, 8, 9, 2, -3, 5};
  CHECK(std::equal(ring, ring + 6, conv_state));
}

TEST(gdn_decode_equals_per_sequence_ops) {
  // Test checkpoints' head shapes, awkward ones (dk != dv, not multiples of 32, GQA 3), K 1, 2, 4.
  const Shape shapes[] = {{2, 4, 32, 32, 4}, {2, 2, 64, 64, 4}, {1, 3, 24, 40, 2},
                          {2, 6, 20, 8, 4},  {2, 4, 32, 32, 1}};
  // 2K + 1 steps: each sequence's position passes through every ring row at least twice.
  for (const Shape& s : shapes)
    for (int64_t n : {1, 3, 17}) check_decode(s, n, static_cast<int>(2 * s.K + 1), 100 + n);
}

TEST(gdn_decode_27b_shape) { check_decode({16, 48, 128, 128, 4}, 3, 5, 7); }

TEST(gdn_decode_fused_norm_equals_separate_norm) {
  // norm_w set: out = rms_norm_gated(o, z rows with a stride, norm_w) of the unfused op, bit for bit.
  for (const Shape& s : {Shape{2, 4, 32, 32, 4}, Shape{1, 3, 24, 40, 2}, Shape{16, 48, 128, 128, 4}})
    for (int64_t n : {1, 3}) {
      pe_test::Rng rng(500 + n);
      Layer fused(s, n + 5, rng);
      Layer plain = fused;
      const std::vector<int32_t> slots = pick_slots(n, fused.n_slots, rng);
      std::vector<int32_t> pos(n);
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(11 * i + 2);
      const int64_t C = s.conv_dim(), z_stride = s.hv * s.dv + 8;
      const auto qkv = rng.normals(n * C), a = rng.normals(n * s.hv), b = rng.normals(n * s.hv);
      const auto z = rng.normals(n * z_stride), w = rng.normals(s.dv);
      std::vector<float> got(n * s.hv * s.dv), want(n * s.hv * s.dv), zd(n * s.hv * s.dv);
      cpu::GdnDecodeArgs fa =
          decode_args(fused, n, qkv.data(), a.data(), b.data(), slots.data(), pos.data(), got.data());
      fa.z = z.data(), fa.z_stride = z_stride, fa.norm_w = w.data(), fa.norm_eps = 1e-6f;
      cpu::gdn_decode(fa);
      cpu::gdn_decode(decode_args(plain, n, qkv.data(), a.data(), b.data(), slots.data(), pos.data(), want.data()));
      for (int64_t i = 0; i < n; ++i)
        std::copy(z.begin() + i * z_stride, z.begin() + i * z_stride + s.hv * s.dv, zd.begin() + i * s.hv * s.dv);
      cpu::rms_norm_gated(want.data(), zd.data(), w.data(), n * s.hv, s.dv, 1e-6f, want.data());
      CHECK(got == want);
      CHECK(fused.rec_pool == plain.rec_pool);
      CHECK(fused.conv_pool == plain.conv_pool);
    }
}

TEST(gdn_decode_chained_equals_in_place_steps_and_copies) {
  // A verify chunk's m tokens as chained calls (rows in strided qkv / a / b rows, out slots): the
  // outputs and every slot equal m in-place decode steps of each sequence with the state copied to
  // the next slot after each of its first m - 1 tokens, bit for bit.
  const Shape s{2, 4, 32, 32, 4};
  pe_test::Rng rng(900);
  const int64_t n = 3, m = 3, C = s.conv_dim(), qs = C + 5, abs = s.hv + 2;
  Layer chained(s, n * m + 2, rng);
  Layer ref = chained;
  const std::vector<int32_t> slots = pick_slots(n * m, chained.n_slots, rng);  // sequence i: slots[m*i + j]
  const auto qkv = rng.normals(n * m * qs), a = rng.normals(n * m * abs, 2.0f), b = rng.normals(n * m * abs, 2.0f);
  std::vector<float> got(n * m * s.hv * s.dv, NAN), want(n * m * s.hv * s.dv);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<int32_t> rows, in, out, pos;
    for (int64_t i = 0; i < n; ++i) {
      rows.push_back(static_cast<int32_t>(m * i + t));
      in.push_back(slots[m * i + t]);
      out.push_back(slots[m * i + (t + 1) % m]);
      pos.push_back(static_cast<int32_t>(7 * i + 1 + t));
      // The reference: live slot slots[m*i] stepped in place, copied after the token.
      const int32_t live = slots[m * i];
      const int64_t r = m * i + t;
      reference_step(ref, qkv.data() + r * qs, a.data() + r * abs, b.data() + r * abs, live, pos.back(),
                     want.data() + r * s.hv * s.dv);
      if (t + 1 < m) {
        std::copy_n(ref.conv_state(live), ref.conv_layer, ref.conv_state(slots[m * i + t + 1]));
        std::copy_n(ref.rec_state(live), ref.rec_layer, ref.rec_state(slots[m * i + t + 1]));
      }
    }
    // Call t reads the slot call t - 1 wrote (the live slot at t = 0) and writes the next one.
    cpu::GdnDecodeArgs d = decode_args(chained, n, qkv.data(), a.data(), b.data(), in.data(), pos.data(), got.data());
    d.rows = rows.data(), d.out_slots = out.data(), d.qkv_stride = qs, d.ab_stride = abs, d.chained = t > 0;
    cpu::gdn_decode(d);
  }
  CHECK(got == want);
  CHECK(chained.conv_pool == ref.conv_pool);
  CHECK(chained.rec_pool == ref.rec_pool);
}
